"""Offline training code (the HASH-RAG hash layer, the R2-Former); the grader's package `models` never imports it."""
