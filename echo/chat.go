package echo

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// chatRequest is the part of a chat completions request the engine reads.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxTokens           *int64         `json:"max_tokens"`
	MaxCompletionTokens *int64         `json:"max_completion_tokens"`
	N                   *int64         `json:"n"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of an array content; only text parts count.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// chatPrompt returns the prompt of a chat request: the messages' contents
// joined by newlines (string contents, and the text parts of array
// contents; other parts and null contents add nothing).
func chatPrompt(msgs []chatMessage) (string, error) {
	if len(msgs) == 0 {
		return "", invalid("messages", "'messages' must be a non-empty array")
	}
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte('\n')
		}
		raw := strings.TrimSpace(string(m.Content))
		switch {
		case raw == "" || raw == "null":
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal([]byte(raw), &s); err != nil {
				return "", invalid("messages["+strconv.Itoa(i)+"].content", "invalid content: %v", err)
			}
			b.WriteString(s)
		case raw[0] == '[':
			var parts []contentPart
			if err := json.Unmarshal([]byte(raw), &parts); err != nil {
				return "", invalid("messages["+strconv.Itoa(i)+"].content", "invalid content parts: %v", err)
			}
			for j, p := range parts {
				if p.Type == "text" {
					if j > 0 {
						b.WriteByte('\n')
					}
					b.WriteString(p.Text)
				}
			}
		default:
			return "", invalid("messages["+strconv.Itoa(i)+"].content", "content must be a string, an array of parts or null")
		}
	}
	return b.String(), nil
}

// chatCompletion is the non-streamed answer.
type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             Usage        `json:"usage"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chatChoice struct {
	Index        int64           `json:"index"`
	Message      chatReply       `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type chatReply struct {
	Role    string          `json:"role"`
	Content string          `json:"content"`
	Refusal json.RawMessage `json:"refusal"`
}

// chatChunk is one streamed event.
type chatChunk struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Created           int64             `json:"created"`
	Model             string            `json:"model"`
	Choices           []chatChunkChoice `json:"choices"`
	SystemFingerprint string            `json:"system_fingerprint"`
	Usage             json.RawMessage   `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int64           `json:"index"`
	Delta        chatDelta       `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// systemFingerprint marks every answer as the echo engine's.
const systemFingerprint = "ration-echo"

// null is the JSON literal for fields OpenAI sends as null.
func null() json.RawMessage { return json.RawMessage("null") }

func (e *Engine) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	body, err := decodeBody(w, r, e.cfg.maxBody, &req)
	if err == nil {
		err = requireModel(req.Model)
	}
	var prompt string
	if err == nil {
		prompt, err = chatPrompt(req.Messages)
	}
	var limit, n int64
	if err == nil {
		limit, err = completionLimit(req.MaxCompletionTokens, req.MaxTokens)
	}
	if err == nil {
		n, err = choiceCount(req.N)
	}
	if err != nil {
		e.refuse(w, r, err)
		return
	}
	out, count, truncated := reply(prompt, limit)
	usage := newUsage(count, n*int64(len(out)))
	id := responseID("chatcmpl-", body)
	created := e.cfg.clock.Now().Unix()
	finish := finishReason(truncated)

	if !req.Stream {
		content := strings.Join(out, " ")
		choices := make([]chatChoice, n)
		for i := range choices {
			choices[i] = chatChoice{
				Index:        int64(i),
				Message:      chatReply{Role: "assistant", Content: content, Refusal: null()},
				Logprobs:     null(),
				FinishReason: finish,
			}
		}
		writeJSON(w, chatCompletion{ID: id, Object: "chat.completion", Created: created, Model: req.Model,
			Choices: choices, Usage: usage, SystemFingerprint: systemFingerprint})
		return
	}

	include := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(choices []chatChunkChoice) chatChunk {
		return chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.Model,
			Choices: choices, SystemFingerprint: systemFingerprint, Usage: usageField(include)}
	}
	one := func(i int64, d chatDelta, fin *string) []chatChunkChoice {
		return []chatChunkChoice{{Index: i, Delta: d, Logprobs: null(), FinishReason: fin}}
	}
	s := startSSE(w)
	empty := ""
	for i := range n {
		s.event(chunk(one(i, chatDelta{Role: "assistant", Content: &empty}, nil)))
	}
	for k, word := range out {
		if !s.pause(r.Context(), e.cfg.delay) {
			return
		}
		piece := word
		if k > 0 {
			piece = " " + word
		}
		for i := range n {
			s.event(chunk(one(i, chatDelta{Content: &piece}, nil)))
		}
	}
	for i := range n {
		s.event(chunk(one(i, chatDelta{}, &finish)))
	}
	if include {
		u, _ := json.Marshal(usage) // cannot fail: integers only
		c := chunk([]chatChunkChoice{})
		c.Usage = u
		s.event(c)
	}
	s.done()
}
