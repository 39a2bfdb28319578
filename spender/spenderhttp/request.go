package spenderhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxTokenCount is where token arithmetic saturates, far above any real
// budget, so absurd max_tokens values become an oversize rejection
// instead of an overflow.
const maxTokenCount = int64(1) << 40

// maxChoices caps the n parameter's multiplier on the completion budget.
const maxChoices = 128

// maxNesting is how deep the prompt extraction follows nested arrays and
// objects (prompt arrays, message parts, Responses API items).
const maxNesting = 6

// negativeMaxError is returned by parseRequest when a max-tokens field is
// negative; the middleware answers it with 400 naming the field.
type negativeMaxError struct {
	field string // the JSON field, e.g. "max_tokens"
	value int64  // its value, saturated at -2^40
}

func (e *negativeMaxError) Error() string {
	return fmt.Sprintf("spenderhttp: %s is %d; it must be at least 0", e.field, e.value)
}

// wireRequest is the part of an OpenAI-compatible request body the stage
// reads. Numbers stay raw so that a float, a string or null in one field
// does not make the whole body unreadable.
// M is the message type: wireMessage (contents only) or, for a
// MessageCounter, wireChatMessage.
type wireRequest[M wireMsg] struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []M             `json:"messages"`
	Input               json.RawMessage `json:"input"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
	N                   json.RawMessage `json:"n"`
	Stream              json.RawMessage `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
}

// wireMsg is a chat message as parseRequest decodes it.
type wireMsg interface {
	wireMessage | wireChatMessage
	parts() (role, name string, content json.RawMessage)
}

// wireMessage is one chat message when only its content is read: decoding
// the role and name would cost allocations no plain Counter needs.
type wireMessage struct {
	Content json.RawMessage `json:"content"`
}

func (m wireMessage) parts() (string, string, json.RawMessage) { return "", "", m.Content }

// wireChatMessage is one chat message as a MessageCounter counts it.
type wireChatMessage struct {
	Role    string          `json:"role"`
	Name    string          `json:"name"`
	Content json.RawMessage `json:"content"`
}

func (m wireChatMessage) parts() (string, string, json.RawMessage) { return m.Role, m.Name, m.Content }

// request is what the stage knows about one request body.
type request struct {
	valid bool   // the body is a JSON object
	model string // the model field, "" if absent
	text  string // PromptText: the text to tokenize
	ids   int64  // token ids given directly (integer prompt/input arrays)

	// messages are the chat messages, for a MessageCounter (parsed with
	// withMessages only); rest is the text outside them (prompt and
	// input), set only when there are messages.
	messages []ChatMessage
	rest     string

	// maxField names the field maxOut came from ("" when none was set);
	// maxOut is the per-choice completion cap in tokens.
	maxField string
	maxOut   int64
	choices  int64 // n, in [1, maxChoices]

	generates    bool // prompt, messages or a max-output field: a completion follows
	chatLike     bool // prompt or messages: chat or completions, which take stream_options
	stream       bool // "stream": true
	includeUsage bool // "stream_options": {"include_usage": true}
}

// parseRequest reads body. A body that is not a JSON object comes back
// with valid false and no error: the stage estimates it from its bytes and
// lets the upstream answer it. The only error is a negative max-tokens
// field, a *negativeMaxError. With withMessages, the chat messages are
// kept for a MessageCounter (req.messages, req.rest).
func parseRequest(body []byte, withMessages bool) (request, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return request{}, nil
	}
	if withMessages {
		return parseObject[wireChatMessage](trimmed, true)
	}
	return parseObject[wireMessage](trimmed, false)
}

// parseObject is parseRequest on a body that starts with '{'.
func parseObject[M wireMsg](trimmed []byte, withMessages bool) (request, error) {
	var req request
	var w wireRequest[M]
	if err := json.Unmarshal(trimmed, &w); err != nil {
		// A field of an unexpected type (messages as an object, say) is
		// skipped and the rest decoded; anything else is not JSON.
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return req, nil
		}
	}
	req.valid = true
	req.model = w.Model
	var texts []string
	collect(w.Prompt, &texts, &req.ids, 0)
	nPrompt := len(texts)
	if withMessages && len(w.Messages) > 0 {
		req.messages = make([]ChatMessage, len(w.Messages))
	}
	for i, m := range w.Messages {
		role, name, content := m.parts()
		start := len(texts)
		collect(content, &texts, &req.ids, 1)
		if req.messages != nil {
			req.messages[i] = ChatMessage{Role: role, Name: name, Content: strings.Join(texts[start:], "\n")}
		}
	}
	nMessages := len(texts)
	collect(w.Input, &texts, &req.ids, 0)
	req.text = strings.Join(texts, "\n")
	if req.messages != nil && (nPrompt > 0 || len(texts) > nMessages) {
		req.rest = strings.Join(append(texts[:nPrompt:nPrompt], texts[nMessages:]...), "\n")
	}
	req.chatLike = len(w.Prompt) > 0 || w.Messages != nil
	req.generates = req.chatLike

	// max_completion_tokens wins over max_tokens (OpenAI deprecated the
	// latter for chat); max_output_tokens is the Responses API's name.
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{
		{"max_completion_tokens", w.MaxCompletionTokens},
		{"max_tokens", w.MaxTokens},
		{"max_output_tokens", w.MaxOutputTokens},
	} {
		v, ok := jsonInt(f.raw)
		if !ok {
			continue
		}
		if v < 0 {
			return req, &negativeMaxError{field: f.name, value: v}
		}
		if req.maxField == "" {
			req.maxField, req.maxOut = f.name, v
			req.generates = true
		}
	}
	req.choices = 1
	if n, ok := jsonInt(w.N); ok && n > 1 {
		req.choices = min(n, maxChoices)
	}
	req.stream = string(w.Stream) == "true"
	if len(w.StreamOptions) > 0 {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if json.Unmarshal(w.StreamOptions, &so) == nil {
			req.includeUsage = so.IncludeUsage
		}
	}
	return req, nil
}

// jsonInt reads an integer-valued JSON number (1000, 1e3, 1000.0),
// saturating at ±maxTokenCount. It reports false for null, absent,
// fractional and non-number values.
func jsonInt(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 || raw[0] == 'n' || raw[0] == '"' || raw[0] == '[' || raw[0] == '{' || raw[0] == 't' || raw[0] == 'f' {
		return 0, false
	}
	s := string(raw)
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return max(-maxTokenCount, min(v, maxTokenCount)), true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	if math.IsNaN(f) || f != math.Trunc(f) {
		return 0, false
	}
	switch {
	case f >= float64(maxTokenCount):
		return maxTokenCount, true
	case f <= -float64(maxTokenCount):
		return -maxTokenCount, true
	}
	return int64(f), true
}

// collect appends the text in raw to texts and counts token ids into ids.
// It understands a string, an array (of strings, of token ids, of arrays
// of token ids, of message objects or content parts), a message object
// (its content) and a content part (its text). Anything else adds nothing.
func collect(raw json.RawMessage, texts *[]string, ids *int64, depth int) {
	if len(raw) == 0 || depth > maxNesting {
		return
	}
	switch raw[0] {
	case '"':
		if s, ok := jsonString(raw); ok && s != "" {
			*texts = append(*texts, s)
		}
	case '[':
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return
		}
		for _, e := range elems {
			if len(e) > 0 && (e[0] == '-' || (e[0] >= '0' && e[0] <= '9')) {
				*ids = satAdd(*ids, 1)
				continue
			}
			collect(e, texts, ids, depth+1)
		}
	case '{':
		var obj struct {
			Type    string          `json:"type"`
			Text    *string         `json:"text"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		if len(obj.Content) > 0 {
			collect(obj.Content, texts, ids, depth+1)
			return
		}
		if obj.Text != nil && *obj.Text != "" && isTextPart(obj.Type) {
			*texts = append(*texts, *obj.Text)
		}
	}
}

// jsonString decodes the JSON string raw. Strings without escapes (most
// prompts) are taken as they are, without a second validation pass.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) >= 2 && raw[len(raw)-1] == '"' && bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 &&
		bytes.IndexByte(raw[1:len(raw)-1], '"') < 0 && utf8.Valid(raw) && !hasControl(raw) {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err == nil
}

// hasControl reports whether b holds a byte below 0x20, which a JSON
// string may not contain unescaped.
func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// isTextPart reports whether a content part of this type carries prompt
// text: chat's "text", the Responses API's "input_text" and "output_text",
// or an untyped part.
func isTextPart(typ string) bool {
	switch typ {
	case "", "text", "input_text", "output_text":
		return true
	}
	return false
}

// satAdd returns a+b for non-negative a and b, saturating at maxTokenCount.
func satAdd(a, b int64) int64 {
	if a > maxTokenCount-b {
		return maxTokenCount
	}
	return a + b
}

// satMul returns a*b for non-negative a and b, saturating at maxTokenCount.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > maxTokenCount/b {
		return maxTokenCount
	}
	return a * b
}

// ceilQuarter returns ceil(n/4): the bytes/4 token estimate.
func ceilQuarter(n int64) int64 { return (n + 3) / 4 }

// PromptText returns the text of an OpenAI-compatible request body that a
// tokenizer should count: the completions prompt (a string, or an array of
// strings joined by newlines), the chat messages' contents joined by
// newlines (string contents and the text parts of array contents), and the
// embeddings input (a string or an array of strings). Responses API input
// items contribute their text parts the same way. Token-id arrays (prompt
// or input given as integers) contribute nothing here: EstimateCost counts
// them directly. A body that is not a JSON object gives "".
//
// The text leaves out what a chat template adds (role markers, a few
// tokens per message), tool definitions and images, so a count of it is a
// slight underestimate for chat; settlement with the actual usage corrects
// it.
func PromptText(body []byte) string {
	req, _ := parseRequest(body, false)
	return req.text
}
