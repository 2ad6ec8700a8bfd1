DROP INDEX jobs_kind_claim_idx;
