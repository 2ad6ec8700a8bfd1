-- The newest job id: where the jobs page's first window starts. The primary
-- key's last entry; no scan.
SELECT coalesce(max(id), 0) AS id FROM jobs
