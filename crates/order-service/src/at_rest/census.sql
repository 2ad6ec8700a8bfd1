-- How many stored secrets are in plaintext (key_id NULL) and how many are
-- sealed under each key id, over every column that `crate::sealed` seals.
-- A read of two small tables (endpoints are capped by ENDPOINTS_MAX), run
-- once at start; it locks nothing.
SELECT key_id, count(*) AS n
FROM (
    SELECT secret AS v FROM endpoints
    UNION ALL SELECT previous_secret FROM endpoints WHERE previous_secret IS NOT NULL
    UNION ALL SELECT nats_credentials FROM endpoints WHERE nats_credentials IS NOT NULL
    UNION ALL SELECT secret FROM sources
    UNION ALL SELECT previous_secret FROM sources WHERE previous_secret IS NOT NULL
    UNION ALL SELECT api_key FROM sources WHERE api_key IS NOT NULL
) AS stored
CROSS JOIN LATERAL (
    SELECT CASE WHEN v LIKE 'enc:v1:%' THEN split_part(v, ':', 3) END AS key_id
) AS k
GROUP BY key_id
ORDER BY key_id NULLS FIRST
