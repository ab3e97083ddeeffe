"""The reference engine: Lightning + transformers + peft, trains Llama-architecture models for real."""
