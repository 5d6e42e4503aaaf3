"""One module per page (or part of the job page): each draws what ``jobsight.dashboard.data`` returns,
and asks nothing of the database itself."""
