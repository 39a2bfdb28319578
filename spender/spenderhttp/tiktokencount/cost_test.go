package tiktokencount_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/spender/spenderhttp/tiktokencount"
)

// TestEncodingCost measures what loading each encoding costs, each in a
// fresh process (this test binary run again): the time of the first
// count (the load), the heap it keeps and the process's resident memory
// after it. It runs only when asked:
//
//	RATION_TIKTOKEN_COST=1 go test -count=1 -run TestEncodingCost -v ./spender/spenderhttp/tiktokencount
func TestEncodingCost(t *testing.T) {
	if child := os.Getenv("RATION_TIKTOKEN_COST_CHILD"); child != "" {
		measureLoad(t, strings.Split(child, ","))
		return
	}
	if os.Getenv("RATION_TIKTOKEN_COST") == "" {
		t.Skip("set RATION_TIKTOKEN_COST=1 to measure")
	}
	for _, models := range []string{"gpt-4", "gpt-4o", "gpt-4,gpt-4o"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestEncodingCost$", "-test.count", "1", "-test.v")
		cmd.Env = append(os.Environ(), "RATION_TIKTOKEN_COST_CHILD="+models)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", models, err, out)
		}
		for line := range strings.Lines(string(out)) {
			if strings.Contains(line, "cost:") {
				t.Log(strings.TrimSpace(line))
			}
		}
	}
}

// measureLoad loads the encodings of models one after the other in this
// process and reports each one's cost.
func measureLoad(t *testing.T, models []string) {
	ctx := context.Background()
	heap0, rss0 := heapInUse(), rssKiB()
	fmt.Printf("cost: start: heap in use %.1f MiB, RSS %.1f MiB\n", mib(heap0), float64(rss0)/1024)
	c := tiktokencount.New(nil)
	for _, m := range models {
		heap, rss := heapInUse(), rssKiB()
		start := time.Now()
		if _, err := c.CountTokens(ctx, m, "hello"); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		heap2, rss2 := heapInUse(), rssKiB()
		fmt.Printf("cost: %s (%s): first count %v; heap in use +%.1f MiB (now %.1f), RSS +%.1f MiB (now %.1f)\n",
			m, tiktokencount.EncodingForModel(m), took.Round(time.Millisecond),
			mib(heap2-heap), mib(heap2), float64(rss2-rss)/1024, float64(rss2)/1024)
	}
	// A second Counter of its own: tiktoken-go keeps the parsed BPE
	// ranks, the Counter builds the rest again.
	d := tiktokencount.New(nil)
	heap, start := heapInUse(), time.Now()
	if _, err := d.CountTokens(ctx, models[0], "hello"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	fmt.Printf("cost: a second New counter, %s: first count %v; heap in use +%.1f MiB\n",
		models[0], took.Round(time.Millisecond), mib(heapInUse()-heap))
	runtime.KeepAlive(c)
	runtime.KeepAlive(d)
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func mib(b uint64) float64 { return float64(int64(b)) / (1 << 20) }

// rssKiB is the process's resident set from /proc/self/status, 0 where
// there is none.
func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
