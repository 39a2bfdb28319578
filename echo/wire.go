package echo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/rationhq/ration/internal/oaierror"
)

// maxChoices caps n, as OpenAI does.
const maxChoices = 128

// Usage is the OpenAI usage object, in tokens (words).
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func newUsage(prompt, completion int64) Usage {
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// badRequest is a client mistake the engine answers 400 with: the message
// and the field at fault ("" for none).
type badRequest struct {
	param string
	msg   string
}

func (e *badRequest) Error() string { return "echo: " + e.msg }

func invalid(param, format string, args ...any) error {
	return &badRequest{param: param, msg: fmt.Sprintf(format, args...)}
}

// tooLarge reports a body over the cap.
type tooLarge struct{ limit int64 }

func (e *tooLarge) Error() string {
	return "echo: request body over " + strconv.FormatInt(e.limit, 10) + " bytes"
}

// decodeBody reads r's body (at most limit bytes) into v and returns the
// raw bytes. Unknown fields are ignored, as OpenAI-compatible engines do;
// a field of the wrong type is an error naming it.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &tooLarge{limit: limit}
		}
		return nil, invalid("", "could not read the request body")
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, invalid("", "the request body is empty; send a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, invalid(te.Field, "invalid type for '%s': expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, invalid("", "the request body is not valid JSON: %v", err)
	}
	return body, nil
}

// writeFailure answers a decoding or validation error.
func writeFailure(w http.ResponseWriter, err error) {
	var br *badRequest
	var tl *tooLarge
	switch {
	case errors.As(err, &br):
		code := "" // a body-level mistake (empty, not JSON) names no field and has no code
		if br.param != "" {
			code = "invalid_value"
		}
		oaierror.Write(w, http.StatusBadRequest, oaierror.TypeInvalidRequest, code, br.param, br.msg)
	case errors.As(err, &tl):
		oaierror.Write(w, http.StatusRequestEntityTooLarge, oaierror.TypeInvalidRequest, "request_too_large", "",
			"Request body too large: the limit is "+strconv.FormatInt(tl.limit, 10)+" bytes.")
	default:
		oaierror.Write(w, http.StatusBadRequest, oaierror.TypeInvalidRequest, "", "", err.Error())
	}
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own types only; cannot happen
		oaierror.Write(w, http.StatusInternalServerError, oaierror.TypeServer, "", "", "echo: encoding the answer failed")
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// requireModel checks the model field every generation request needs.
func requireModel(model string) error {
	if model == "" {
		return invalid("model", "you must provide a model parameter")
	}
	return nil
}

// completionLimit picks the per-choice output cap in tokens from
// max_completion_tokens, else max_tokens; 0 means no cap. A value below 1
// is an error naming its field.
func completionLimit(maxCompletion, maxTokens *int64) (int64, error) {
	switch {
	case maxCompletion != nil:
		if *maxCompletion < 1 {
			return 0, invalid("max_completion_tokens", "invalid 'max_completion_tokens': %d is below the minimum value of 1", *maxCompletion)
		}
		return *maxCompletion, nil
	case maxTokens != nil:
		if *maxTokens < 1 {
			return 0, invalid("max_tokens", "invalid 'max_tokens': %d is below the minimum value of 1", *maxTokens)
		}
		return *maxTokens, nil
	}
	return 0, nil
}

// choiceCount validates n (default 1).
func choiceCount(n *int64) (int64, error) {
	if n == nil {
		return 1, nil
	}
	if *n < 1 || *n > maxChoices {
		return 0, invalid("n", "invalid 'n': %d is outside [1, %d]", *n, maxChoices)
	}
	return *n, nil
}

// streamOptions is the stream_options object.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// texts decodes a prompt or input field: a string, an array of strings, an
// array of token IDs (one text of decimal words) or an array of such
// arrays. field names it in errors; a missing field is an error.
func texts(field string, raw json.RawMessage) ([]string, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid(field, "missing required parameter: '%s'", field)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) == 0 {
			return nil, invalid(field, "'%s' must not be an empty array", field)
		}
		return ss, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return nil, invalid(field, "'%s' must not be an empty array", field)
		}
		return []string{idText(ids)}, nil
	}
	var nested [][]int64
	if json.Unmarshal(raw, &nested) == nil && len(nested) > 0 {
		out := make([]string, len(nested))
		for i, ids := range nested {
			out[i] = idText(ids)
		}
		return out, nil
	}
	return nil, invalid(field, "invalid '%s': expected a string, an array of strings, an array of token IDs or an array of such arrays", field)
}

// idText writes token IDs as a text of decimal words, so each ID is one
// token.
func idText(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}
