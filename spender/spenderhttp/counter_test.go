package spenderhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rationhq/ration/spender/spenderhttp"
)

func TestTokenizeCounter(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		answer  string
		want    int64
		wantErr bool
	}{
		{"tokens array", 200, `{"tokens":[101,2023,2003,1037,3231]}`, 5, false},
		{"vLLM count wins", 200, `{"count":4,"max_model_len":8192,"tokens":[1,2,3,4]}`, 4, false},
		{"count alone", 200, `{"count":9}`, 9, false},
		{"bare array", 200, `[7, 8, 9]`, 3, false},
		{"empty tokens", 200, `{"tokens":[]}`, 0, false},
		{"token strings", 200, `{"tokens":["a,b","c]"]}`, 2, false},
		{"server error", 500, `{"tokens":[1]}`, 0, true},
		{"not found", 404, `not here`, 0, true},
		{"not JSON", 200, `tokens: 5`, 0, true},
		{"no known field", 200, `{"ids":[1,2]}`, 0, true},
		{"broken array", 200, `{"tokens":[1,2`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got struct{ Model, Text string }
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/v1/tokenize" {
					t.Errorf("%s %s, want POST /v1/tokenize", r.Method, r.URL.Path)
				}
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				var raw map[string]any
				if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
					t.Errorf("request body: %v", err)
				}
				got.Model, _ = raw["model"].(string)
				got.Text, _ = raw["text"].(string)
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.answer))
			}))
			defer srv.Close()

			c := spenderhttp.TokenizeCounter{BaseURL: srv.URL + "/", Client: srv.Client()}
			n, err := c.CountTokens(context.Background(), "llama-3", "hello world")
			if got.Model != "llama-3" || got.Text != "hello world" {
				t.Errorf("posted %+v, want {llama-3 hello world}", got)
			}
			if tt.wantErr {
				if err == nil || !errors.Is(err, spenderhttp.ErrTokenize) {
					t.Errorf("err %v, want one wrapping ErrTokenize", err)
				}
				return
			}
			if err != nil || n != tt.want {
				t.Errorf("CountTokens = %d, %v; want %d", n, err, tt.want)
			}
		})
	}
}

func TestTokenizeCounterTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := spenderhttp.TokenizeCounter{BaseURL: srv.URL, Client: srv.Client(), Timeout: 20 * time.Millisecond}
	_, err := c.CountTokens(context.Background(), "m", "x")
	if !errors.Is(err, spenderhttp.ErrTokenize) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want ErrTokenize wrapping context.DeadlineExceeded", err)
	}
	// The estimate falls back to bytes/4 when the tokenizer times out.
	cost := spenderhttp.EstimateCost(context.Background(), c, []byte(`{"model":"m","prompt":"12345678","max_tokens":1}`))
	if cost.Tokens != 3 {
		t.Errorf("estimate with a hung tokenizer: %+v, want 2+1 tokens", cost)
	}
}

func TestTokenizeCounterNoBaseURL(t *testing.T) {
	_, err := spenderhttp.TokenizeCounter{}.CountTokens(context.Background(), "m", "x")
	if !errors.Is(err, spenderhttp.ErrTokenize) {
		t.Errorf("err %v, want ErrTokenize", err)
	}
}
