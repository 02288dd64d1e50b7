"""Tests of the enforcement backends of the node agent."""
