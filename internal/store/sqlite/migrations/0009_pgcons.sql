-- SQLite has one writer at a time: events commit in id order, and paging by id alone
-- never skips one (PostgreSQL's 0008 records each event's transaction for that).
-- Nothing changes here; the file keeps both backends' migration versions in step.
SELECT 1;
