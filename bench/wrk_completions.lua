-- bench/wrk_completions.lua: short non-streaming completions for wrk.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "gpt2", "prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0.8}'
