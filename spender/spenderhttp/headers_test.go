package spenderhttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

func TestSetHeaders(t *testing.T) {
	clk := newClock()
	// The worked example, step 1: RPM 3, TPM 1000, after reserving 300 tokens.
	hand := spender.Status{LimitRequests: 3, RemainingRequests: 2, LimitTokens: 1000, RemainingTokens: 700,
		ResetTokens: 18 * time.Second, ResetRequests: 20 * time.Second}
	tests := []struct {
		name string
		s    spender.Status
		opts []spenderhttp.Option
		want map[string]string // "" = must be absent
	}{
		{"hand example", hand, nil, map[string]string{
			"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "20s",
			"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "700", "x-ratelimit-reset-tokens": "18s",
			"anthropic-ratelimit-tokens-limit": "", "ratelimit": "", "ratelimit-policy": "",
		}},
		{"resets round up to the millisecond", spender.Status{LimitTokens: 10, ResetTokens: 1200*time.Millisecond + time.Microsecond}, nil,
			map[string]string{"x-ratelimit-reset-tokens": "1.201s", "x-ratelimit-limit-requests": ""}},
		{"minutes", spender.Status{LimitTokens: 10, ResetTokens: 6 * time.Minute}, nil, map[string]string{"x-ratelimit-reset-tokens": "6m0s"}},
		{"full bucket", spender.Status{LimitTokens: 10, RemainingTokens: 10}, nil, map[string]string{"x-ratelimit-reset-tokens": "0s"}},
		{"negative remaining shows 0", spender.Status{LimitTokens: 10, RemainingTokens: -5, ResetTokens: time.Minute}, nil,
			map[string]string{"x-ratelimit-remaining-tokens": "0"}},
		{"unlimited requests: no request headers", spender.Status{LimitTokens: 10, RemainingTokens: 4}, nil, map[string]string{
			"x-ratelimit-limit-requests": "", "x-ratelimit-remaining-requests": "", "x-ratelimit-reset-requests": "",
			"x-ratelimit-limit-tokens": "10"}},
		{"unlimited: nothing", spender.Status{}, []spenderhttp.Option{spenderhttp.WithAnthropicHeaders(), spenderhttp.WithIETFHeaders()},
			map[string]string{"x-ratelimit-limit-tokens": "", "anthropic-ratelimit-tokens-limit": "", "ratelimit-policy": ""}},
		{"anthropic", hand, []spenderhttp.Option{spenderhttp.WithAnthropicHeaders(), spenderhttp.WithClock(clk)}, map[string]string{
			"anthropic-ratelimit-requests-limit": "3", "anthropic-ratelimit-requests-remaining": "2",
			"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:20Z",
			"anthropic-ratelimit-tokens-limit":   "1000", "anthropic-ratelimit-tokens-remaining": "700",
			"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:18Z",
			"x-ratelimit-limit-tokens":         "1000",
		}},
		{"anthropic reset rounds up", spender.Status{LimitTokens: 5, ResetTokens: 1500 * time.Millisecond},
			[]spenderhttp.Option{spenderhttp.WithAnthropicHeaders(), spenderhttp.WithClock(clk)},
			map[string]string{"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:02Z"}},
		{"ietf", hand, []spenderhttp.Option{spenderhttp.WithIETFHeaders()}, map[string]string{
			"ratelimit-policy": `"requests";q=3;w=60, "tokens";q=1000;qu="tokens";w=60`,
			"ratelimit":        `"requests";r=2;t=20, "tokens";r=700;t=18`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			h.Set("x-ratelimit-limit-tokens", "stale upstream value")
			if tt.s.LimitTokens == 0 {
				h.Del("x-ratelimit-limit-tokens")
			}
			spenderhttp.SetHeaders(h, tt.s, tt.opts...)
			for name, want := range tt.want {
				got := h.Values(name)
				switch {
				case want == "" && len(got) > 0:
					t.Errorf("%s = %q, want absent", name, got)
				case want != "" && (len(got) != 1 || got[0] != want):
					t.Errorf("%s = %q, want [%q]", name, got, want)
				}
			}
		})
	}
}
