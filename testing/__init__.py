"""What tests and benchmarks share, in one place both import (never installed: the wheel holds
`maskstream` only): small real dataset versions written as the build writes them, tokenizer
families, a local GCS emulator."""
