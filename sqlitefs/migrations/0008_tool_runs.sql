-- v8: what an agent keeps with its approval requests, and the runs of
-- approved calls the daemon makes for it.

-- context is the agent's own state when it asked ('' for none), handed
-- back with the decision. run_state (0 not started, 1 started, 2
-- finished) is claimed before an approved call runs, so a crash never runs
-- it twice; run_result is what it returned.
ALTER TABLE approvals ADD COLUMN context TEXT NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN run_state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE approvals ADD COLUMN run_result TEXT NOT NULL DEFAULT '';
