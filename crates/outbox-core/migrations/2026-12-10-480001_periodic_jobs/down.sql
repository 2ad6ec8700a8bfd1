DROP TABLE periodic_slots;
DROP TABLE periodic_jobs;
