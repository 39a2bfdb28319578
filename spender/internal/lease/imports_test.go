package lease_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoShell: the lease core is pure. It imports no lock, atomic,
// logger, metric, RPC or wire package: the driver does the I/O, the proto
// conversion, the logging and the metrics, and owns the concurrency.
func TestImportsNoShell(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := strings.Fields(string(out))
	if len(imports) == 0 {
		t.Fatal("go list named no imports")
	}
	forbidden := []string{"sync", "sync/atomic", "log/slog", "connectrpc.com/", "github.com/rationhq/ration/proto/", "github.com/prometheus/"}
	for _, imp := range imports {
		for _, f := range forbidden {
			if imp == f || strings.HasSuffix(f, "/") && strings.HasPrefix(imp, f) {
				t.Errorf("the lease core imports %s", imp)
			}
		}
	}
}
