-- A queue table churns: every job is inserted, updated two or three times and
-- later deleted. With the default thresholds (20% of the table) autovacuum
-- comes too late: dead index entries pile up in jobs_claim_idx, which every
-- claim must step over, and a table that has never been analyzed gets a
-- bitmap-scan-and-sort claim plan instead of an ordered index scan. Vacuum and
-- analyze after 2% of the rows changed instead.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02
);
