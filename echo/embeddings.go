package echo

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"net/http"
)

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int64          `json:"dimensions"`
}

type embeddingList struct {
	Object string          `json:"object"`
	Data   []embedding     `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingsUsage `json:"usage"`
}

type embedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingsUsage struct {
	PromptTokens int64 `json:"prompt_tokens"`
	TotalTokens  int64 `json:"total_tokens"`
}

func (e *Engine) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	_, err := decodeBody(w, r, e.cfg.maxBody, &req)
	if err == nil {
		err = requireModel(req.Model)
	}
	var inputs []string
	if err == nil {
		inputs, err = texts("input", req.Input)
	}
	dims := int64(DefaultDimensions)
	if err == nil && req.Dimensions != nil {
		dims = *req.Dimensions
		if dims < 1 || dims > MaxDimensions {
			err = invalid("dimensions", "invalid 'dimensions': %d is outside [1, %d]", dims, MaxDimensions)
		}
	}
	if err == nil && req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		err = invalid("encoding_format", "invalid 'encoding_format': %q; use \"float\" or \"base64\"", req.EncodingFormat)
	}
	if err != nil {
		e.refuse(w, r, err)
		return
	}
	out := embeddingList{Object: "list", Data: make([]embedding, len(inputs)), Model: req.Model}
	for i, in := range inputs {
		vec := Embed(in, int(dims))
		var v any = vec
		if req.EncodingFormat == "base64" {
			v = encodeBase64(vec)
		}
		out.Data[i] = embedding{Object: "embedding", Index: i, Embedding: v}
		out.Usage.PromptTokens += int64(CountTokens(in))
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, out)
}

// Embed returns the engine's embedding of text: dims float32 values, a
// deterministic function of the text's words (FNV-1a of the word list and
// the coordinate), normalised to length 1. A text without words gets the
// unit vector along the first axis.
func Embed(text string, dims int) []float32 {
	vec := make([]float32, dims)
	words := Words(text)
	if len(words) == 0 || dims == 0 {
		if dims > 0 {
			vec[0] = 1
		}
		return vec
	}
	var sum float64
	raw := make([]float64, dims)
	for i := range raw {
		h := fnv.New64a()
		var idx [8]byte
		binary.LittleEndian.PutUint64(idx[:], uint64(i))
		_, _ = h.Write(idx[:])
		for _, w := range words {
			_, _ = h.Write([]byte(w))
			_, _ = h.Write([]byte{0})
		}
		x := float64(h.Sum64()>>11)/float64(1<<53)*2 - 1 // in [-1, 1)
		raw[i] = x
		sum += x * x
	}
	norm := math.Sqrt(sum)
	if norm == 0 {
		vec[0] = 1
		return vec
	}
	for i, x := range raw {
		vec[i] = float32(x / norm)
	}
	return vec
}

// encodeBase64 is OpenAI's base64 encoding_format: the little-endian
// float32 bytes, standard base64.
func encodeBase64(vec []float32) string {
	b := make([]byte, 4*len(vec))
	for i, x := range vec {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
