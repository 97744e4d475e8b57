"""Models brought in from elsewhere: `gguf` turns a GGUF file (llama.cpp's format) into an ordinary Hugging Face
model folder, and checks that the folder answers a prompt; `sandboxed` runs it in the engine's sandbox, where the
platform's worker calls it (a GGUF is untrusted input)."""
