//go:build faults

package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rationhq/ration/internal/testkit"
)

// key is one entry of a gateway-demo keys file (docs/gateway-demo.md).
// Every case spends its own key with a small RPM limit and no TPM limit,
// so the requests bucket alone decides and the bound is tight.
type key struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	RPM    int    `json:"rpm"`
	TPM    int    `json:"tpm"`
}

// writeKeys writes a keys file and returns its path.
func writeKeys(t *testing.T, keys ...key) string {
	t.Helper()
	return testkit.KeysFile(t, keys)
}

// chatBody is the request every client sends: one short prompt, one
// completion token, so each costs one request and little CPU.
const chatBody = `{"model":"echo","max_tokens":1,"messages":[{"role":"user","content":"fault suite"}]}`

// loadSpec is an open-loop load: rate requests a second in all, spread
// over targets (gateway base URLs) by weights in a fixed rotation (weights
// 16, 3, 1 send 16 of every 20 requests to the first target).
type loadSpec struct {
	key     string
	targets []string
	weights []int // nil: equal
	rate    float64
	workers int // concurrent requests at most
}

// load is a running loadSpec.
type load struct {
	spec    loadSpec
	start   time.Time
	stopped chan struct{} // closed by stop: no more requests are offered
	done    chan struct{} // closed once every request offered is answered or failed
	end     time.Time     // set before done closes

	mu      sync.Mutex
	status  []map[int]int // per target: status code -> count; 0 = no answer (transport error)
	admits  []span        // every request answered 200: when it was sent and answered
	errs    []string      // a few transport errors, for messages
	dropped int           // ticks with every worker busy and the queue full
}

// span is one request's life at its client: from just before it was sent
// to just after its answer was read. The gateway admitted it somewhere
// within.
type span struct{ sent, answered time.Time }

// newLoadClient is the clients' HTTP client: keep-alive connections to
// every gateway, and a timeout well above the longest a gateway may hold
// a request (the slow-path deadline plus one allocator call,
// docs/leasing.md), so that a gateway that stops answering shows as a
// failed request rather than a hung test.
func newLoadClient(workers int) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 4 * workers, MaxIdleConnsPerHost: workers, IdleConnTimeout: time.Minute}}
}

// startLoad starts offering spec's load until stop is called or ctx ends.
// Each request is bounded by the client's timeout, not by stop: a request
// under way when the load stops is still counted.
func startLoad(ctx context.Context, spec loadSpec) *load {
	if spec.weights == nil {
		spec.weights = make([]int, len(spec.targets))
		for i := range spec.weights {
			spec.weights[i] = 1
		}
	}
	l := &load{spec: spec, start: time.Now(), stopped: make(chan struct{}), done: make(chan struct{}),
		status: make([]map[int]int, len(spec.targets))}
	for i := range l.status {
		l.status[i] = map[int]int{}
	}
	client := newLoadClient(spec.workers)
	jobs := make(chan int, 4*spec.workers)
	var wg sync.WaitGroup
	for range spec.workers {
		wg.Go(func() {
			for target := range jobs {
				sent := time.Now()
				code, err := sendChat(ctx, client, spec.targets[target], spec.key)
				answered := time.Now()
				l.mu.Lock()
				l.status[target][code]++
				if code == http.StatusOK {
					l.admits = append(l.admits, span{sent, answered})
				}
				if err != nil && len(l.errs) < 5 {
					l.errs = append(l.errs, err.Error())
				}
				l.mu.Unlock()
			}
		})
	}
	go func() {
		defer func() {
			close(jobs)
			wg.Wait()
			client.CloseIdleConnections()
			l.end = time.Now()
			close(l.done)
		}()
		slots := 0
		for _, w := range spec.weights {
			slots += w
		}
		tk := time.NewTicker(time.Duration(float64(time.Second) / spec.rate))
		defer tk.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-l.stopped:
				return
			case <-tk.C:
			}
			target, slot := 0, n%slots
			for slot >= spec.weights[target] {
				slot -= spec.weights[target]
				target++
			}
			select {
			case jobs <- target:
			default:
				l.mu.Lock()
				l.dropped++
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// sendChat sends chatBody to the gateway at base with key k and returns
// the answer's status.
func sendChat(ctx context.Context, client *http.Client, base, k string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+k)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// stop stops offering and waits until every request offered has its
// answer; it returns the results. The window the bound is checked over
// runs from before the first request to after the last answer.
func (l *load) stop(ctx context.Context, t *testing.T) loadResult {
	t.Helper()
	select {
	case <-l.stopped:
	default:
		close(l.stopped)
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		t.Fatalf("the load's last requests did not end: %v", ctx.Err())
	}
	return l.result()
}

// count returns how many answers so far had status code (all targets).
func (l *load) count(code int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.status {
		n += m[code]
	}
	return n
}

func (l *load) result() loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := loadResult{start: l.start, elapsed: l.end.Sub(l.start), dropped: l.dropped, errs: l.errs,
		byTarget: make([]map[int]int, len(l.status)), admits: slices.Clone(l.admits)}
	for i, m := range l.status {
		r.byTarget[i] = map[int]int{}
		for code, n := range m {
			r.byTarget[i][code] = n
		}
	}
	return r
}

// loadResult is what a load's clients saw.
type loadResult struct {
	start    time.Time     // before the first request
	elapsed  time.Duration // before the first request to after the last answer
	byTarget []map[int]int // per target: status -> count; 0 = transport error
	admits   []span        // the requests answered 200, in the order answered
	dropped  int
	errs     []string
}

func (r loadResult) count(code int) int {
	n := 0
	for _, m := range r.byTarget {
		n += m[code]
	}
	return n
}

// plus is r and s counted together (their start and elapsed are r's).
func (r loadResult) plus(s loadResult) loadResult {
	out := loadResult{start: r.start, elapsed: r.elapsed, dropped: r.dropped + s.dropped,
		errs: append(append([]string(nil), r.errs...), s.errs...), admits: append(slices.Clone(r.admits), s.admits...)}
	for i := range max(len(r.byTarget), len(s.byTarget)) {
		m := map[int]int{}
		for _, src := range []loadResult{r, s} {
			if i < len(src.byTarget) {
				for code, n := range src.byTarget[i] {
					m[code] += n
				}
			}
		}
		out.byTarget = append(out.byTarget, m)
	}
	return out
}

func (r loadResult) total() int {
	n := 0
	for _, m := range r.byTarget {
		for _, c := range m {
			n += c
		}
	}
	return n
}

// String is a one-line summary: counts by status.
func (r loadResult) String() string {
	all := map[int]int{}
	for _, m := range r.byTarget {
		for code, n := range m {
			all[code] += n
		}
	}
	codes := make([]int, 0, len(all))
	for c := range all {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests in %v:", r.total(), r.elapsed.Round(time.Millisecond))
	for _, c := range codes {
		if c == 0 {
			fmt.Fprintf(&b, " %d failed", all[c])
		} else {
			fmt.Fprintf(&b, " %d×%d", all[c], c)
		}
	}
	if r.dropped > 0 {
		fmt.Fprintf(&b, " (%d not offered: every worker busy)", r.dropped)
	}
	return b.String()
}

// only200or429 fails the test for every answer that is neither 200 nor
// 429: through any allocator fault a gateway admits or refuses, and never
// fails a request (a 5xx) or stops answering (a transport error).
func (r loadResult) only200or429(t *testing.T) {
	t.Helper()
	for i, m := range r.byTarget {
		for code, n := range m {
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				what := fmt.Sprintf("status %d", code)
				if code == 0 {
					what = fmt.Sprintf("no answer (%s)", strings.Join(r.errs, "; "))
				}
				t.Errorf("target %d: %d requests got %s; want only 200 or 429", i+1, n, what)
			}
		}
	}
	if r.dropped > 0 {
		t.Errorf("%d requests were not offered: every client worker was busy (the gateways held requests too long)", r.dropped)
	}
}
