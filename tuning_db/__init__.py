"""Shipped tuning tables (exported JSON files) that dispatch uses by default."""
