"""Tests of jobsight.rules: the server-side rules, run on their own shapes without a database."""
