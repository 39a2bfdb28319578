// Package echo is a deterministic OpenAI-compatible inference engine for
// demos and tests: it "generates" by echoing the prompt, so every number
// it answers with can be predicted from the request.
//
// A token is a whitespace-separated word (Words, CountTokens). Endpoints:
//
//	POST /v1/chat/completions  the messages' contents (joined by newlines)
//	                           echoed as one reply, cut at
//	                           max_completion_tokens or max_tokens words;
//	                           n copies; stream: true sends one SSE chunk
//	                           per word, and a final usage chunk when
//	                           stream_options.include_usage is true
//	POST /v1/completions       the same for each prompt (a string, strings,
//	                           token IDs, or arrays of token IDs)
//	POST /v1/embeddings        Embed of each input; "float" or "base64"
//	POST /v1/tokenize          {"count", "max_model_len", "tokens"} for
//	                           "text", "prompt" or "messages"; also at
//	                           /tokenize
//	GET  /v1/models            the models of WithModels (default "echo");
//	                           GET /v1/models/{id} one of them
//
// # Guarantees
//
//   - usage is exact: prompt_tokens is the number of words in the prompt
//     (for chat: in the message contents, string or text parts),
//     completion_tokens the words in the replies (all n choices),
//     total_tokens their sum. /v1/tokenize of the same text counts the
//     same prompt_tokens, so a limiter that counts with it reserves the
//     prompt exactly.
//   - The answer is a pure function of the request body and the clock
//     (which only sets "created"): IDs are hashes of the body.
//   - finish_reason is "length" when the reply was cut at the max, else
//     "stop".
//   - Bad input is a 4xx in the OpenAI error shape naming the field
//     (wrong type, missing model or messages, max below 1, n outside
//     [1, 128], dimensions outside [1, 4096]), never a 500; bodies over
//     WithMaxBodyBytes get 413. Unknown fields are ignored.
//   - Streams are flushed after every event through
//     http.ResponseController, and stop when the client leaves.
//
// # Caveats
//
//   - Any non-empty model name is accepted and echoed back; only
//     GET /v1/models consults the model list.
//   - A request without a max is not cut at all (OpenAI's legacy
//     completions would stop at 16 tokens).
//   - Whitespace in the reply is normalised to single spaces.
//   - Tool calls, logprobs, images and audio are not generated; image
//     parts of a message do not count as prompt tokens.
//   - Token IDs from /v1/tokenize are hashes of the words modulo
//     VocabSize, not a vocabulary: they cannot be decoded.
package echo
