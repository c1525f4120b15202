"""Alert triage: each alert's status, assignee and notes (`alert_triage`), and the analyst's queue."""
