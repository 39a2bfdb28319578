package spenderhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadBodyFirstBuffer: a body declaring less than minBodyChunk is read
// into one buffer of its length plus the byte that reads the end; any
// other body starts at minBodyChunk, whatever length it declares, and the
// charge to the in-flight budget is the buffers allocated.
func TestReadBodyFirstBuffer(t *testing.T) {
	small := strings.Repeat("a", 100)
	big := strings.Repeat("b", minBodyChunk+1)
	tests := []struct {
		name     string
		body     string
		declared int64 // -1: unknown
		held     int64
	}{
		{"small, declared", small, 100, 101},
		{"small, unknown length", small, -1, minBodyChunk},
		{"declared just under the chunk", big[:minBodyChunk-1], minBodyChunk - 1, minBodyChunk},
		{"declared at the chunk", big[:minBodyChunk], minBodyChunk, minBodyChunk + 2*minBodyChunk},
		{"declared over the chunk", big, minBodyChunk + 1, minBodyChunk + 2*minBodyChunk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", io.NopCloser(strings.NewReader(tt.body)))
			r.ContentLength = tt.declared
			b := &bodyBudget{max: 1 << 20}
			body, held, tooLarge, err := readBody(r, 1<<20, b)
			if err != nil || tooLarge || string(body) != tt.body {
				t.Fatalf("readBody: %d bytes, tooLarge %v, err %v; want the %d bytes sent", len(body), tooLarge, err, len(tt.body))
			}
			if held != tt.held || b.used.Load() != tt.held {
				t.Errorf("held %d, charged %d; want %d", held, b.used.Load(), tt.held)
			}
		})
	}
}
