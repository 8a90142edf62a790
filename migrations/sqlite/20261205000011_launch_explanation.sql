-- The placement explanation of the round that chose to launch an instance for its job (what
-- waiting for existing capacity would have cost and when it would have finished), shown with
-- the job's placement once the job runs on that instance.
ALTER TABLE instances ADD COLUMN launch_explanation_json TEXT;
