"""The Hugging Face side: from_pretrained/save, export, model building by name, Trainer callback, PEFT."""
