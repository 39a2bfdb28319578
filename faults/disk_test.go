//go:build faults

package faults

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size (mount's syntax, "4m") on a new
// directory and unmounts it when the test ends, after every process the
// test starts later is killed (cleanups run last first). It fails, never
// skips, where mounting is not allowed: the case needs root.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount -t tmpfs -o size=%s tmpfs %s: %v (the full-disk case needs root, or CAP_SYS_ADMIN)", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("umount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes zeros to path until the file system is full (ENOSPC) and
// returns how much it wrote.
func fill(ctx context.Context, t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("creating the filler: %v", err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var n int64
	for ctx.Err() == nil {
		k, err := f.Write(chunk)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("filling the disk: %v", err)
		}
	}
	t.Fatalf("filling the disk: %v", ctx.Err())
	return n
}

// TestAllocatorFullDiskKeepsTheBound puts the allocator's data directory
// on a 4 MB tmpfs and fills it under a load above the key's limit. Its
// commits fail: /readyz answers 503 and calls fail, while the gateways
// answer every request 200 or 429 (no 500) and the bound holds. Once the
// filler is deleted, /readyz answers 200 again and grants resume.
func TestAllocatorFullDiskKeepsTheBound(t *testing.T) {
	ctx := deadline(t, 60*time.Second)
	disk := mountTmpfs(t, "4m")
	f := startFleet(ctx, t, fleetSpec{name: "disk", rpm: 600, ttl: 2 * time.Second, procs: 2, instances: 2,
		dataDir: filepath.Join(disk, "data")})
	l := f.overLimit(ctx, t, 150)

	filler := filepath.Join(disk, "filler")
	wrote := fill(ctx, t, filler)
	full := time.Now()
	unready := waitStatus(ctx, t, f.alloc.proc, f.alloc.url()+"/readyz", http.StatusServiceUnavailable)
	t.Logf("disk full after %d KiB of filler; /readyz 503 within %v", wrote>>10, unready.Round(time.Millisecond))
	pause(ctx, 3*time.Second) // the gateways run on a failing allocator for a while
	am := mustScrape(ctx, t, f.alloc.url()+"/metrics")
	commitErrs, unavailable := am.sum("ration_allocator_commit_errors_total"), am.sum("ration_allocator_calls_total", "code", "unavailable")
	t.Logf("while full (%v): %.0f failed commits, %.0f calls answered unavailable", time.Since(full).Round(time.Millisecond), commitErrs, unavailable)
	if commitErrs == 0 || unavailable == 0 {
		t.Errorf("a full disk made %.0f commits fail and %.0f calls unavailable; want both above 0", commitErrs, unavailable)
	}
	if code, err := getStatus(ctx, f.alloc.url()+"/readyz"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the disk still full: %d, %v; want 503", code, err)
	}
	granted := am.sum("ration_allocator_granted_total", "dimension", "requests")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	ready := waitStatus(ctx, t, f.alloc.proc, f.alloc.url()+"/readyz", http.StatusOK)
	t.Logf("filler deleted: /readyz 200 within %v", ready.Round(time.Millisecond))
	mark := mustReadGateways(ctx, t, f.urls())
	back := f.waitLeased(ctx, t, mark, 20)
	t.Logf("then 20 lease admissions and no instance in fallback within %v", back.Round(time.Millisecond))
	if after := mustScrape(ctx, t, f.alloc.url()+"/metrics").sum("ration_allocator_granted_total", "dimension", "requests"); after <= granted {
		t.Errorf("no grant after the disk was freed: granted_total{requests} %.0f, was %.0f", after, granted)
	}
	f.alloc.alive(t)
	f.finish(ctx, t, l)
}
