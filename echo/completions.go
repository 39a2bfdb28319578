package echo

import (
	"encoding/json"
	"net/http"
	"strings"
)

// completionRequest is the part of a legacy completions request the engine
// reads.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int64          `json:"max_tokens"`
	N             *int64          `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	Usage             *Usage             `json:"usage,omitempty"`
	SystemFingerprint string             `json:"system_fingerprint"`
}

type completionChoice struct {
	Text         string          `json:"text"`
	Index        int64           `json:"index"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// completionChunk is one streamed event: a completion whose usage is raw
// so it can be null, absent or the final object.
type completionChunk struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Usage             json.RawMessage    `json:"usage,omitempty"`
}

// promptReply is the echo of one prompt.
type promptReply struct {
	words     int64    // prompt tokens
	out       []string // the reply's tokens
	truncated bool
}

func (e *Engine) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	body, err := decodeBody(w, r, e.cfg.maxBody, &req)
	if err == nil {
		err = requireModel(req.Model)
	}
	var prompts []string
	if err == nil {
		prompts, err = texts("prompt", req.Prompt)
	}
	var limit, n int64
	if err == nil {
		limit, err = completionLimit(nil, req.MaxTokens)
	}
	if err == nil {
		n, err = choiceCount(req.N)
	}
	if err == nil && int64(len(prompts))*n > maxChoices {
		err = invalid("n", "prompts × n is %d; at most %d choices per request", int64(len(prompts))*n, maxChoices)
	}
	if err != nil {
		e.refuse(w, r, err)
		return
	}
	replies := make([]promptReply, len(prompts))
	var usage Usage
	for i, p := range prompts {
		out, count, cut := reply(p, limit)
		replies[i] = promptReply{words: count, out: out, truncated: cut}
		usage.PromptTokens += count
		usage.CompletionTokens += n * int64(len(out))
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	id := responseID("cmpl-", body)
	created := e.cfg.clock.Now().Unix()

	if !req.Stream {
		var choices []completionChoice
		for i, rp := range replies {
			text, fin := strings.Join(rp.out, " "), finishReason(rp.truncated)
			for j := range n {
				choices = append(choices, completionChoice{Text: text, Index: int64(i)*n + j, Logprobs: null(), FinishReason: &fin})
			}
		}
		writeJSON(w, completion{ID: id, Object: "text_completion", Created: created, Model: req.Model,
			Choices: choices, Usage: &usage, SystemFingerprint: systemFingerprint})
		return
	}

	include := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(index int64, text string, fin *string) completionChunk {
		return completionChunk{ID: id, Object: "text_completion", Created: created, Model: req.Model,
			Choices:           []completionChoice{{Text: text, Index: index, Logprobs: null(), FinishReason: fin}},
			SystemFingerprint: systemFingerprint, Usage: usageField(include)}
	}
	s := startSSE(w)
	for i, rp := range replies {
		for k, word := range rp.out {
			if !s.pause(r.Context(), e.cfg.delay) {
				return
			}
			piece := word
			if k > 0 {
				piece = " " + word
			}
			for j := range n {
				s.event(chunk(int64(i)*n+j, piece, nil))
			}
		}
		fin := finishReason(rp.truncated)
		for j := range n {
			s.event(chunk(int64(i)*n+j, "", &fin))
		}
	}
	if include {
		u, _ := json.Marshal(usage) // cannot fail: integers only
		s.event(completionChunk{ID: id, Object: "text_completion", Created: created, Model: req.Model,
			Choices: []completionChoice{}, SystemFingerprint: systemFingerprint, Usage: u})
	}
	s.done()
}
