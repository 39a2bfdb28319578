//go:build faults

package faults

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// What every client is told (docs/contract.md, "The leased contract"),
// checked from the clients' side on real processes: the README's tour,
// then an idle key's budget back on another gateway; clients that honour
// Retry-After; and a key at half its limit through every way of losing an
// allocator cluster's leader.

// answer is what a client got for one chat request.
type answer struct {
	code int
	hdr  http.Header
	body string
}

// chat sends chatBody to the gateway at base with key k.
func chat(ctx context.Context, client *http.Client, base, k string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+k)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, hdr: resp.Header, body: string(b)}, err
}

// rejectFigures reads a 429's message: "Limit L, Remaining R, Requested Q.
// ... (Retry-After: S seconds)" (spender/spenderhttp/apierror.go).
var rejectFigures = regexp.MustCompile(`Remaining (\d+), Requested (\d+)\..*\(Retry-After: (\d+) seconds\)`)

// retryAfter checks a 429 (on the requests dimension, as every request of
// these keys is refused on: their TPM is far from reach) and returns its
// Retry-After: the message and the headers say one remaining figure, below
// what was asked, and one wait.
func retryAfter(t *testing.T, a answer) time.Duration {
	t.Helper()
	m := rejectFigures.FindStringSubmatch(a.body)
	if m == nil {
		t.Errorf("a 429 whose message does not say what remains and when to come back: %s", a.body)
		return time.Second
	}
	remaining, requested := m[1], m[2]
	if hdr := a.hdr.Get("X-Ratelimit-Remaining-Requests"); hdr != remaining {
		t.Errorf("a 429 says Remaining %s in its message and %s in x-ratelimit-remaining-requests: %s", remaining, hdr, a.body)
	}
	if r, _ := strconv.Atoi(remaining); r >= must(strconv.Atoi(requested)) {
		t.Errorf("a 429 says %s remaining for %s requested: %s", remaining, requested, a.body)
	}
	s, err := strconv.Atoi(a.hdr.Get("Retry-After"))
	if err != nil || strconv.Itoa(s) != m[3] {
		t.Errorf("a 429 says Retry-After %q in its header and %s in its message", a.hdr.Get("Retry-After"), m[3])
	}
	return time.Duration(max(s, 1)) * time.Second
}

// must is v, for an err the pattern that matched the text rules out.
func must(v int, _ error) int { return v }

// TestClientContractOnTheDemo runs gateway-demo (3 instances) on an
// allocator process with the default lease TTL (10 s), and on it, at once:
//
//   - the README's tour: demo-small (3 RPM) spent on gateways 1, 2, 3, 3:
//     the fourth is refused with Retry-After 20, the exact wait; then 75
//     idle seconds, and gateway 2 admits 3 of 4 (the whole burst: nothing
//     stayed with gateways 1 and 3);
//   - four clients, each on a 3 RPM key of its own, each request to a
//     random instance, that come back exactly ⌈Retry-After⌉ after a 429:
//     at least 90% of those retries are admitted.
//
// Every 429 says one remaining figure in its message and headers, below
// what was asked, and one Retry-After. A TTL after the last request every
// instance holds no key (ration_spender_keys_held 0), the allocator no
// lease (ration_allocator_holdings 0), and no instance calls it again.
// The case waits on the clock (a 3 RPM key refills a request every 20
// s), so it runs beside the other parallel cases.
func TestClientContractOnTheDemo(t *testing.T) {
	t.Parallel()
	const (
		ttl      = 10 * time.Second // cmd/allocator's default
		idle     = 75 * time.Second
		clients  = 4
		duration = 100 * time.Second // the retry loops: about 4 retries per key
	)
	ctx := deadline(t, duration+idle+60*time.Second)
	small := key{Key: "sk-ration-demo-small", ID: "demo-small", Tenant: "demo", RPM: 3, TPM: 1000}
	keys := []key{small}
	for i := range clients {
		keys = append(keys, key{Key: fmt.Sprintf("sk-faults-retry-%d", i), ID: fmt.Sprintf("faults-retry-%d", i), Tenant: "faults", RPM: 3, TPM: 1000})
	}
	alloc := startAllocator(ctx, t, ttl, "")
	gw := startGateway(ctx, t, "gateway-demo", gatewaySpec{instances: 3, keysFile: writeKeys(t, keys...), alloc: alloc})
	client := newLoadClient(8)

	var wg sync.WaitGroup
	wg.Go(func() { readmeTourThenIdle(ctx, t, client, gw.urls, small.Key, idle) })
	var mu sync.Mutex
	var retries, admitted int
	for i := range clients {
		wg.Go(func() {
			r, a := honourRetryAfter(ctx, t, client, gw.urls, keys[1+i].Key, duration, uint64(i))
			mu.Lock()
			retries, admitted = retries+r, admitted+a
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("honoured retries: %d of %d admitted", admitted, retries)
	if retries < clients*3 || admitted*10 < retries*9 {
		t.Errorf("%d of %d retries that waited as Retry-After said were admitted, want at least 90%%", admitted, retries)
	}

	// Everything back a TTL after the last request, and no more calls.
	pause(ctx, ttl)
	calls := mustReadGateways(ctx, t, gw.urls).acquireCalls
	pause(ctx, 3*time.Second)
	held := 0.0
	for _, u := range gw.urls {
		held += mustScrape(ctx, t, u+"/metrics").sum("ration_spender_keys_held")
	}
	holdings := mustScrape(ctx, t, alloc.url()+"/metrics").sum("ration_allocator_holdings")
	after := mustReadGateways(ctx, t, gw.urls).acquireCalls
	t.Logf("a TTL after the last request: keys_held %.0f, allocator holdings %.0f, %.0f calls in the next 3 s", held, holdings, after-calls)
	if held != 0 || holdings != 0 || after != calls {
		t.Errorf("a TTL after the last request: keys_held %.0f, allocator holdings %.0f, %.0f more calls; want 0, 0, 0", held, holdings, after-calls)
	}
	gw.alive(t)
	alloc.alive(t)
}

// readmeTourThenIdle is the README's tour on key k over urls (gateways 1,
// 2, 3, 3), then idle seconds, then 4 requests on gateway 2.
func readmeTourThenIdle(ctx context.Context, t *testing.T, client *http.Client, urls []string, k string, idle time.Duration) {
	var codes []int
	var last answer
	for _, i := range []int{0, 1, 2, 2} {
		a, err := chat(ctx, client, urls[i], k)
		if err != nil {
			t.Errorf("the tour: %v", err)
			return
		}
		codes, last = append(codes, a.code), a
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" {
		t.Errorf("the tour on gateways 1, 2, 3, 3 answered %v, want 200 200 200 429", codes)
		return
	}
	if wait := retryAfter(t, last); wait < 19*time.Second || wait > 20*time.Second {
		t.Errorf("the tour's 429 said Retry-After %v, want the exact wait, 20 s (19 s if a second passed)", wait)
	}
	pause(ctx, idle)
	n := 0
	for range 4 {
		a, err := chat(ctx, client, urls[1], k)
		if err != nil {
			t.Errorf("after %v idle: %v", idle, err)
			return
		}
		if a.code == http.StatusOK {
			n++
		} else {
			retryAfter(t, a)
		}
	}
	t.Logf("the tour: %v, then after %v idle gateway 2 admitted %d of 4", codes, idle, n)
	if n != 3 {
		t.Errorf("after %v idle gateway 2 admitted %d of 4 requests of a 3 RPM key, want 3", idle, n)
	}
}

// honourRetryAfter sends key k's requests one after another for d, each
// to a random instance of urls: the next at once after a 200, exactly the
// Retry-After after a 429 (whole seconds, as the SDKs do). It returns the
// retries it made after a 429 and how many were admitted.
func honourRetryAfter(ctx context.Context, t *testing.T, client *http.Client, urls []string, k string, d time.Duration, seed uint64) (retries, admitted int) {
	rng := rand.New(rand.NewPCG(seed, 25))
	end := time.Now().Add(d)
	retry := false
	for time.Now().Before(end) && ctx.Err() == nil {
		a, err := chat(ctx, client, urls[rng.IntN(len(urls))], k)
		if err != nil {
			t.Errorf("key %s: %v", k, err)
			return
		}
		if retry {
			retries++
		}
		switch a.code {
		case http.StatusOK:
			if retry {
				admitted++
			}
			retry = false
		case http.StatusTooManyRequests:
			retry = true
			pause(ctx, retryAfter(t, a))
		default:
			t.Errorf("key %s: status %d: %s", k, a.code, a.body)
			return
		}
	}
	return retries, admitted
}

// TestNoFalse429ThroughFailover runs three allocator processes as one raft
// cluster, each member in its own network namespace (lease TTL 2 s, so
// that leases run out within each fault; the default election timeout,
// 1 s), and three gateway-demo processes, and
// sends a key of 600 RPM half its limit, evenly, while the cluster loses
// its leader in each way: SIGKILL, SIGTERM (each restarted on its data
// directory), SIGSTOP for 10 s, and cut off from its peers but not from the
// gateways for 6 s. Not one request is refused, counted at the clients:
// the gateways ride through on their leases and then their fallback, which
// goes on at each one's share from its last answer. Every answer is 200,
// and the bound holds over the run.
func TestNoFalse429ThroughFailover(t *testing.T) {
	t.Parallel()
	ctx := deadline(t, 150*time.Second)
	start := time.Now()
	const rpm = 600
	f := startFleet(ctx, t, fleetSpec{name: "no429", rpm: rpm, ttl: 2 * time.Second, procs: 3, instances: 1,
		members: 3, election: time.Second})
	c := f.cluster
	p := newProber(t, c, "faults-no429-probe")
	l := startLoad(ctx, loadSpec{key: f.key.Key, targets: f.urls(), rate: rpm / 60.0 / 2, workers: 16})
	pause(ctx, 5*time.Second) // leases and shares settle

	refused := func(what string, since int) int {
		n := l.count(http.StatusTooManyRequests)
		t.Logf("%s: %d refused (%d answered 200 so far)", what, n-since, l.count(http.StatusOK))
		return n
	}
	n := refused("before the faults", 0)

	lead := c.leader(ctx, t, c.all())
	from := time.Now()
	c.kill(ctx, t, lead)
	d := p.served(ctx, t, from, "after SIGKILL of the leader")
	c.members[lead].restart(ctx, t)
	c.leader(ctx, t, c.all())
	n = refused(fmt.Sprintf("leader m%d killed (-9), served again after %v, restarted", lead, d.Round(time.Millisecond)), n)

	lead = c.leader(ctx, t, c.all())
	from = time.Now()
	c.members[lead].signal(t, syscall.SIGTERM)
	c.members[lead].stopped(ctx, t, 20*time.Second)
	d = p.served(ctx, t, from, "after SIGTERM of the leader")
	c.members[lead].restart(ctx, t)
	c.leader(ctx, t, c.all())
	n = refused(fmt.Sprintf("leader m%d stopped (SIGTERM), served again after %v, restarted", lead, d.Round(time.Millisecond)), n)

	lead = c.leader(ctx, t, c.all())
	from = time.Now()
	c.members[lead].signal(t, syscall.SIGSTOP)
	d = p.served(ctx, t, from, "after SIGSTOP of the leader")
	pause(ctx, 10*time.Second-time.Since(from))
	c.members[lead].signal(t, syscall.SIGCONT)
	c.leader(ctx, t, c.all())
	n = refused(fmt.Sprintf("leader m%d frozen (SIGSTOP) 10 s, served again after %v", lead, d.Round(time.Millisecond)), n)

	lead = c.leader(ctx, t, c.all())
	from = time.Now()
	c.net.isolate(t, lead)
	d = p.served(ctx, t, from, "after cutting the leader off from its peers")
	pause(ctx, 6*time.Second-time.Since(from))
	c.net.rejoin(t, lead)
	c.leader(ctx, t, c.all())
	refused(fmt.Sprintf("leader m%d cut off from its peers (not the gateways) 6 s, served again after %v", lead, d.Round(time.Millisecond)), n)

	pause(ctx, 2*time.Second)
	res, gw, _ := f.finish(ctx, t, l)
	t.Logf("gateways: %.0f admitted, %.0f under the fallback policy; %.0f allocator call attempts failed", gw.admitted, gw.fallback, gw.callErrors)
	if n := res.count(http.StatusTooManyRequests); n > 0 {
		t.Errorf("%d requests refused 429 at half the key's limit through the failovers", n)
	}
	if gw.callErrors == 0 {
		t.Errorf("no gateway saw a failed allocator call: the faults did not reach them")
	}
	t.Logf("whole case: %v", time.Since(start).Round(time.Millisecond))
}
