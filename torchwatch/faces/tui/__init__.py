"""The Textual TUI. It reads the session's analyses and statuses; it never calls a source."""
