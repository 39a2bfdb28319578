package echo

import (
	"net/http"
	"strings"
)

// tokenizeRequest takes the text as "text" (what spenderhttp's
// TokenizeCounter sends), "prompt" (vLLM's /tokenize) or chat "messages".
type tokenizeRequest struct {
	Model    string        `json:"model"`
	Text     *string       `json:"text"`
	Prompt   *string       `json:"prompt"`
	Messages []chatMessage `json:"messages"`
}

type tokenizeAnswer struct {
	Count       int64   `json:"count"`
	MaxModelLen int64   `json:"max_model_len"`
	Tokens      []int64 `json:"tokens"`
}

// maxModelLen is the context length the tokenizer reports; the engine
// itself enforces none.
const maxModelLen = 1 << 20

func (e *Engine) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	_, err := decodeBody(w, r, e.cfg.maxBody, &req)
	var text string
	if err == nil {
		switch {
		case req.Text != nil:
			text = *req.Text
		case req.Prompt != nil:
			text = *req.Prompt
		case req.Messages != nil:
			text, err = chatPrompt(req.Messages)
		default:
			err = invalid("text", "missing required parameter: 'text' (or 'prompt' or 'messages')")
		}
	}
	if err != nil {
		e.refuse(w, r, err)
		return
	}
	var ids []int64
	for w := range strings.FieldsSeq(text) { // not a slice of every word besides
		ids = append(ids, TokenID(w))
	}
	writeJSON(w, tokenizeAnswer{Count: int64(len(ids)), MaxModelLen: maxModelLen, Tokens: ids})
}
