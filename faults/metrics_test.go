//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// sample is one line of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is one scrape of a /metrics endpoint.
type metrics []sample

// scrape reads url (a /metrics endpoint) in the Prometheus text format.
// The suite parses it itself rather than depend on an exposition library:
// it needs names, labels and values only.
func scrape(ctx context.Context, url string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := control.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return m, nil
}

// parseMetrics reads samples in the Prometheus text format, skipping
// blank and comment lines.
func parseMetrics(r io.Reader) (metrics, error) {
	var m metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, err
		}
		m = append(m, s)
	}
	return m, sc.Err()
}

// parseSample parses `name{k="v",...} value [timestamp]`.
func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("bad sample line %q", line)
	}
	rest := line[i:]
	s.name = line[:i]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return s, fmt.Errorf("bad labels in %q", line)
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var val strings.Builder
			for {
				if rest == "" {
					return s, fmt.Errorf("unterminated label value in %q", line)
				}
				c := rest[0]
				rest = rest[1:]
				if c == '"' {
					break
				}
				if c == '\\' && rest != "" {
					c, rest = rest[0], rest[1:]
					if c == 'n' {
						c = '\n'
					}
				}
				val.WriteByte(c)
			}
			s.labels[key] = val.String()
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value in %q: %w", line, err)
	}
	s.value = v
	return s, nil
}

// sum adds the samples named name whose labels include every pair of
// kv (key, value, key, value...).
func (m metrics) sum(name string, kv ...string) float64 {
	var total float64
next:
	for _, s := range m {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if s.labels[kv[i]] != kv[i+1] {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// has reports whether any sample is named name.
func (m metrics) has(name string) bool {
	for _, s := range m {
		if s.name == name {
			return true
		}
	}
	return false
}

// gatewayCounts are one moment's counters of a set of gateway instances,
// summed: what their Limiters admitted (ration_spender_admitted_total, by
// path, spender/metrics.go), refused, and what they answered.
type gatewayCounts struct {
	admitted      float64 // every path
	fallback      float64 // path="fallback": admitted under the fallback policy
	leased        float64 // path="local" or "slow": from a lease the allocator granted
	slow          float64 // path="slow": admitted after waiting for the allocator
	acquireCalls  float64 // lease_calls_total{method="Acquire"}: call attempts, any result
	rateLimited   float64 // rejected_total{reason="rate_limited"}
	inFallback    float64 // instances whose fallback gauge is 1 now
	callErrors    float64 // lease_calls_total{result="error"}
	answered200   float64 // requests_total{route="/v1/chat/completions",code="200"}
	answered5xx   float64 // requests_total with a 5xx code, any route
	inFlight      float64 // ration_gateway_in_flight
	goroutinesMax float64 // the largest go_goroutines among the instances' processes
}

// readGateways scrapes every instance's /metrics and sums them.
func readGateways(ctx context.Context, urls []string) (gatewayCounts, error) {
	var c gatewayCounts
	for _, u := range urls {
		m, err := scrape(ctx, u+"/metrics")
		if err != nil {
			return c, err
		}
		if !m.has("ration_spender_admitted_total") {
			return c, fmt.Errorf("%s/metrics has no ration_spender_admitted_total", u)
		}
		c.admitted += m.sum("ration_spender_admitted_total")
		c.fallback += m.sum("ration_spender_admitted_total", "path", "fallback")
		c.leased += m.sum("ration_spender_admitted_total", "path", "local") + m.sum("ration_spender_admitted_total", "path", "slow")
		c.slow += m.sum("ration_spender_admitted_total", "path", "slow")
		c.acquireCalls += m.sum("ration_spender_lease_calls_total", "method", "Acquire")
		c.rateLimited += m.sum("ration_spender_rejected_total", "reason", "rate_limited")
		c.inFallback += m.sum("ration_spender_fallback")
		c.callErrors += m.sum("ration_spender_lease_calls_total", "result", "error")
		c.answered200 += m.sum("ration_gateway_requests_total", "route", "/v1/chat/completions", "code", "200")
		for _, s := range m {
			if s.name == "ration_gateway_requests_total" && strings.HasPrefix(s.labels["code"], "5") {
				c.answered5xx += s.value
			}
		}
		c.inFlight += m.sum("ration_gateway_in_flight")
		c.goroutinesMax = max(c.goroutinesMax, m.sum("go_goroutines"))
	}
	return c, nil
}

// mustReadGateways is readGateways, failing the test on an error.
func mustReadGateways(ctx context.Context, t *testing.T, urls []string) gatewayCounts {
	t.Helper()
	c, err := readGateways(ctx, urls)
	if err != nil {
		t.Fatalf("reading the gateways' metrics: %v", err)
	}
	return c
}

// mustScrape is scrape, failing the test on an error.
func mustScrape(ctx context.Context, t *testing.T, url string) metrics {
	t.Helper()
	m, err := scrape(ctx, url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	return m
}

// allocatorCalls summarises ration_allocator_calls_total by method and
// code, for logs: "Acquire ok 512, Release ok 3".
func allocatorCalls(m metrics) string {
	var parts []string
	for _, s := range m {
		if s.name == "ration_allocator_calls_total" && s.value > 0 {
			parts = append(parts, fmt.Sprintf("%s %s %.0f", s.labels["method"], s.labels["code"], s.value))
		}
	}
	return strings.Join(parts, ", ")
}
