"""Iterative mining of paper 001: chunking, query generation, judging, triples, training."""
