"""Tuning: search serving configurations against an SLO on the customer's own traffic."""
