package ration

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"unicode"
)

// ReadTokenFile reads the bearer tokens in the file at path, one per line,
// for the allocator (which accepts any of them) and a spender (which sends
// the first). Blank lines and lines starting with # are skipped and
// surrounding spaces trimmed. It fails, naming the file, when the file is
// not private (see checkTokenFileMode), when a token contains a space or a
// control character (it could not travel as "Authorization: Bearer
// <token>"), or when the file holds no token. The error never echoes a
// token.
func ReadTokenFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if err := checkTokenFileMode(path, fi.Mode().Perm(), ownedByRoot(fi)); err != nil {
		return nil, err
	}
	var tokens []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.IndexFunc(line, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			return nil, fmt.Errorf("token file %s: line %d: a token cannot contain spaces or control characters", path, n)
		}
		tokens = append(tokens, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("token file %s holds no token", path)
	}
	return tokens, nil
}

// checkTokenFileMode refuses a token file that others can read or write,
// or that its group can write, and one its group can read unless root owns
// it. A root-owned file readable by its group is a grant made on purpose,
// and it is how the usual secret stores hand a file to a service that does
// not run as root: a Kubernetes secret volume with fsGroup (root, the
// pod's group, 0440) and systemd's LoadCredential= (root, 0400 plus a read
// ACL for the service's user, which stat shows as 0440). PostgreSQL
// accepts its key files on the same rule.
func checkTokenFileMode(path string, perm os.FileMode, rootOwned bool) error {
	switch {
	case perm&0o027 != 0:
		return fmt.Errorf("token file %s: writable by group or open to others (mode %#o); chmod 600 it", path, perm)
	case perm&0o040 != 0 && !rootOwned:
		return fmt.Errorf("token file %s: readable by group (mode %#o) and not owned by root; chmod 600 it", path, perm)
	}
	return nil
}
