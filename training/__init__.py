"""Offline training code (the HASH-RAG hash layer, the R2-Former, the answering LLM on judged runs); the grader's
package `models` never imports it."""
