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
// surrounding spaces trimmed. It fails, naming the file, when the file can
// be read by group or others (a secret: chmod 600), when a token contains
// a space or a control character (it could not travel as
// "Authorization: Bearer <token>"), or when the file holds no token. The
// error never echoes a token.
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
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("token file %s: readable by group or others (mode %#o); chmod 600 it", path, perm)
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
