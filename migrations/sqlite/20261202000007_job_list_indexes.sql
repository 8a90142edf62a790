-- Listing a team's recent jobs by state, newest first, without scanning the team's history;
-- (state, id) serves operators' state filters and the queue-depth count.
CREATE INDEX jobs_team_state_id ON jobs(team, state, id);
CREATE INDEX jobs_state_id ON jobs(state, id);
DROP INDEX jobs_state;
