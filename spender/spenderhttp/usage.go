package spenderhttp

import (
	"bytes"
	"encoding/json"
)

// usage is the token usage an OpenAI-compatible upstream reports: chat and
// completions use prompt/completion tokens, the Responses API input/output
// tokens, embeddings prompt tokens only.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// tokens returns the total the key is charged: total_tokens, or the sum of
// the parts when that is larger (some engines omit the total). Negative
// fields count as 0.
func (u *usage) tokens() int64 {
	parts := satAdd(satAdd(max(u.PromptTokens, 0), max(u.CompletionTokens, 0)),
		satAdd(max(u.InputTokens, 0), max(u.OutputTokens, 0)))
	return max(min(u.TotalTokens, maxTokenCount), parts)
}

// spent is the usage as budgets meter it: input is prompt_tokens plus
// input_tokens, output completion_tokens plus output_tokens (an answer has
// one pair or the other), total the larger of total_tokens and their sum.
func (u *usage) spent() spent {
	in := satAdd(max(u.PromptTokens, 0), max(u.InputTokens, 0))
	out := satAdd(max(u.CompletionTokens, 0), max(u.OutputTokens, 0))
	return spent{requests: 1, input: in, output: out, total: u.tokens()}
}

// jsonUsage is the top level of a JSON answer: usage for chat,
// completions, embeddings and Responses; response.usage for a Responses
// stream's final event.
type jsonUsage struct {
	Usage    *usage `json:"usage"`
	Response *struct {
		Usage *usage `json:"usage"`
	} `json:"response"`
}

func (j *jsonUsage) get() *usage {
	if j.Usage != nil {
		return j.Usage
	}
	if j.Response != nil {
		return j.Response.Usage
	}
	return nil
}

// usageFromJSON reads the usage of a complete JSON answer: the last
// "usage" member, found without decoding the rest (an embeddings answer is
// mostly vectors). Nested "usage" members other than the top level's do
// not occur in OpenAI-compatible answers.
func usageFromJSON(body []byte) *usage { return usageFromTail(body) }

// usageFromTail finds the last "usage" member in the tail of a JSON answer
// too large to keep whole, and decodes the object after it. A "usage"
// inside a JSON string is escaped (\"usage\") and is skipped.
func usageFromTail(tail []byte) *usage {
	key := []byte(`"usage"`)
	for end := len(tail); end > 0; {
		i := bytes.LastIndex(tail[:end], key)
		if i < 0 {
			return nil
		}
		end = i
		if i > 0 && tail[i-1] == '\\' {
			continue
		}
		rest := bytes.TrimLeft(tail[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		end := objectEnd(rest)
		if end < 0 {
			continue
		}
		var u usage
		if json.Unmarshal(rest[:end], &u) == nil {
			return &u
		}
	}
	return nil
}

// streamChunk is the part of one SSE data payload the stage reads: the
// usage (non-null only in the final chunk when include_usage is on) and
// the generated text, counted when no usage ever comes.
type streamChunk struct {
	jsonUsage
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Refusal          string `json:"refusal"`
			ToolCalls        []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Delta json.RawMessage `json:"delta"` // Responses API text deltas (a string)
}

// outputBytes returns the bytes of generated text in the chunk.
func (c *streamChunk) outputBytes() int64 {
	var n int64
	if len(c.Delta) >= 2 && c.Delta[0] == '"' {
		n = int64(len(c.Delta) - 2) // escapes count as written
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		n += int64(len(ch.Text) + len(ch.Delta.Content) + len(ch.Delta.ReasoningContent) + len(ch.Delta.Refusal))
		for _, tc := range ch.Delta.ToolCalls {
			n += int64(len(tc.Function.Arguments))
		}
	}
	return n
}

// objectEnd returns the length of the JSON object at the start of b, or
// -1 when b does not start with a complete object. It only balances braces
// outside strings; json.Unmarshal validates the result.
func objectEnd(b []byte) int {
	if len(b) == 0 || b[0] != '{' {
		return -1
	}
	depth := 0
	var sc stringSkipper
	for i, c := range b {
		if sc.inString(c) {
			continue
		}
		switch c {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// stringSkipper follows JSON strings through a byte stream, so scanners
// can act on structural bytes only.
type stringSkipper struct {
	in, escaped bool
}

// inString reports whether c is part of a JSON string (its quotes
// included), updating the state.
func (s *stringSkipper) inString(c byte) bool {
	switch {
	case s.escaped:
		s.escaped = false
	case s.in && c == '\\':
		s.escaped = true
	case c == '"':
		s.in = !s.in
		return true
	case !s.in:
		return false
	}
	return true
}
