"""Helpers the tests share: builders, running servers, captures. No tests here."""
