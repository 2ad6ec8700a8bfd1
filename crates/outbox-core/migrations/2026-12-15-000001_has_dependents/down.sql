DROP TRIGGER jobs_parents_have_dependents ON jobs;
DROP FUNCTION jobs_mark_parents();
-- A view's columns cannot be dropped by replacing it: it is made again, as
-- the migrations before this one left it (the core's columns, then any
-- application's own, in the order `jobs` has them).
DROP VIEW jobs_all;
ALTER TABLE jobs DROP COLUMN has_dependents;
ALTER TABLE jobs_done DROP COLUMN has_dependents;
CREATE VIEW jobs_all AS
SELECT * FROM jobs
UNION ALL
SELECT * FROM jobs_done;
