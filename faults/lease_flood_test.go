//go:build faults

package faults

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// leaseFloodEnv sets the flood's length, 45 s unless it says otherwise
// (RATION_FAULTS_FLOOD=10s, for a quicker look while developing).
const leaseFloodEnv = "RATION_FAULTS_FLOOD"

// TestFloodFromOneCredential: under the suite's token, a client makes a
// 1-key call every 50 ms, alone for 10 s, then while two callers under the
// hostile token send Acquire calls of 1,024 new keys each, back to back. (The sessions'
// quota is TestQuotaPerCredential's and TestCredentialsOverTheWire's: a
// caller that makes a new spender id per call is not refused until 4,096,
// and each such call is a commit like any other caller's.) The allocator runs with its default quotas
// (-max-keys-per-credential 100000, -max-sessions-per-credential 4096).
// The flood must be refused RESOURCE_EXHAUSTED once its credential is at
// its quota; the allocator's resident memory (VmRSS sampled every 250 ms,
// and VmHWM) must stay under 300 MB and its data directory under 100 MB;
// the other client's calls must all succeed, within 50 ms at the 99th
// percentile during the flood, or, where the machine's own load puts its
// p99 before the flood above 25 ms, within twice that.
func TestFloodFromOneCredential(t *testing.T) {
	duration := 45 * time.Second
	if v := os.Getenv(leaseFloodEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", leaseFloodEnv, v, err)
		}
		duration = d
	}
	const (
		rssLimitKB  = 300 << 10 // 300 MB
		diskLimit   = 100 << 20 // 100 MB
		p99Limit    = 50 * time.Millisecond
		floodCalls  = 2
		batch       = 1024
		otherPeriod = 50 * time.Millisecond
		baseline    = 10 * time.Second // the other client alone first
	)
	ctx := deadline(t, baseline+duration+60*time.Second)
	alloc := startAllocator(ctx, t, 10*time.Second, "", append([]string{"-token-file", writeTokens(t)}, strings.Fields(os.Getenv("XALLOC"))...)...)
	pid := alloc.pid()

	type sample struct {
		at       time.Duration
		rssKB    int64
		dirBytes int64
	}
	var (
		samples []sample
		codes   sync.Map // connect code or "ok" -> *atomic.Int64
		calls   atomic.Int64
	)
	count := func(err error) {
		k := "ok"
		if err != nil {
			k = connect.CodeOf(err).String()
		}
		v, _ := codes.LoadOrStore(k, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		calls.Add(1)
	}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	hostile := leaseClient(alloc.url(), hostileToken)
	var wg sync.WaitGroup
	flooding := make(chan struct{}) // closed when the flood starts, after the baseline
	var floodOn atomic.Bool
	for w := range floodCalls {
		wg.Go(func() {
			select {
			case <-fctx.Done():
				return
			case <-flooding:
			}
			// New keys every call; their names are built cheaply, since the
			// flood's client shares the two cores with the allocator.
			prefix := []byte(fmt.Sprintf("flood-%d-", w))
			for n := 0; fctx.Err() == nil; n++ {
				req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: string(prefix[:len(prefix)-1]), Epoch: 1, Sequence: uint64(n + 1)},
					Keys: make([]*leasev1.KeyAcquire, batch)}
				limits, want := &leasev1.Limits{Rpm: 600}, &leasev1.Amount{Requests: 1}
				for i := range req.Keys {
					name := strconv.AppendInt(append(strconv.AppendInt(prefix[:len(prefix):len(prefix)], int64(n), 10), '-'), int64(i), 10)
					req.Keys[i] = &leasev1.KeyAcquire{Key: string(name), Limits: limits, Want: want}
				}
				_, err := hostile.Acquire(fctx, req)
				if fctx.Err() == nil {
					count(err)
				}
			}
		})
	}
	var lat, base []time.Duration // the other client's, during the flood and before it
	var otherErrs []error
	wg.Go(func() { // the other client
		c := leaseClient(alloc.url(), token)
		tk := time.NewTicker(otherPeriod)
		defer tk.Stop()
		for n := 0; ; n++ {
			select {
			case <-fctx.Done():
				return
			case <-tk.C:
			}
			start := time.Now()
			_, err := c.Acquire(fctx, &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "other", Epoch: 1, Sequence: uint64(n + 1)},
				Keys: []*leasev1.KeyAcquire{{Key: "other-key", Limits: &leasev1.Limits{Rpm: 60_000}, Want: &leasev1.Amount{Requests: 1}}}})
			if fctx.Err() != nil {
				return
			}
			if floodOn.Load() {
				lat = append(lat, time.Since(start))
			} else {
				base = append(base, time.Since(start))
			}
			if err != nil && len(otherErrs) < 5 {
				otherErrs = append(otherErrs, err)
			}
		}
	})
	pause(ctx, baseline)
	floodOn.Store(true)
	close(flooding)
	start := time.Now()
	for time.Since(start) < duration && ctx.Err() == nil {
		samples = append(samples, sample{at: time.Since(start), rssKB: statusKB(t, pid, "VmRSS"), dirBytes: dirSize(t, alloc.dataDir)})
		pause(ctx, 250*time.Millisecond)
	}
	stop()
	wg.Wait()
	hwm := statusKB(t, pid, "VmHWM")

	var byCode []string
	codes.Range(func(k, v any) bool {
		byCode = append(byCode, fmt.Sprintf("%v %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(byCode)
	var peakRSS, peakDir int64
	for _, s := range samples {
		peakRSS, peakDir = max(peakRSS, s.rssKB), max(peakDir, s.dirBytes)
	}
	slices.Sort(lat)
	slices.Sort(base)
	p99, base99 := pct(lat, 99), pct(base, 99)
	t.Logf("%v of flood: %d hostile calls (%v); VmRSS peak %d KiB, VmHWM %d KiB; data dir peak %.1f MB; the other client's %d calls: p50 %v, p99 %v, max %v; before the flood, %d calls: p50 %v, p99 %v, max %v",
		duration, calls.Load(), byCode, peakRSS, hwm, float64(peakDir)/(1<<20), len(lat), pct(lat, 50), p99, pct(lat, 100),
		len(base), pct(base, 50), base99, pct(base, 100))
	m := mustScrape(ctx, t, alloc.url()+"/metrics")
	if n := m.sum("ration_allocator_commit_duration_seconds_count"); n > 0 {
		t.Logf("allocator: %.0f commits, %.1f ms each on average", n, 1000*m.sum("ration_allocator_commit_duration_seconds_sum")/n)
	}
	if v, ok := codes.Load(connect.CodeResourceExhausted.String()); !ok || v.(*atomic.Int64).Load() == 0 {
		t.Errorf("the flood was never refused resource_exhausted: %v", byCode)
	}
	if peakRSS >= rssLimitKB || hwm >= rssLimitKB {
		t.Errorf("the allocator's resident memory reached %d KiB (VmHWM %d KiB); want under 300 MB", peakRSS, hwm)
	}
	if peakDir >= diskLimit {
		t.Errorf("the data directory reached %.1f MB; want under 100 MB", float64(peakDir)/(1<<20))
	}
	if len(otherErrs) > 0 {
		t.Errorf("the other client's calls failed: %v", otherErrs)
	}
	// 50 ms at the 99th percentile is the target; on a machine whose own
	// load puts the other client's p99 above 25 ms before the flood (a
	// commit's fsync is most of a call), the flood may at most double it.
	if limit := max(p99Limit, 2*base99); len(lat) < int(duration/otherPeriod)/2 || p99 > limit {
		t.Errorf("the other client made %d calls during the flood, p99 %v; want about %d within %v (p99 %v before it)",
			len(lat), p99, int(duration/otherPeriod), limit, base99)
	}
	alloc.alive(t)
}

// dirSize is the bytes of the files under dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatalf("sizing %s: %v", dir, err)
	}
	return n
}

// pct is the p-th percentile of the sorted durations (0 if none).
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}
