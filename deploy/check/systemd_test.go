package check

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"
)

const systemdDir = repoRoot + "/deploy/systemd"

// unit is a systemd unit file: section -> key -> its values in order
// (LoadCredential= and others may repeat).
type unit map[string]map[string][]string

// parseUnit reads a unit file: comments, sections, key=value lines. A
// continuation line (a trailing backslash) is joined to its key.
func parseUnit(text string) (unit, error) {
	u := unit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	var pending string
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return nil, fmt.Errorf("line %d: %q is neither a section nor key=value in one", n, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u, nil
}

// last is the value in force of a key that a later line overrides.
func (u unit) last(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// readEnvFile reads an EnvironmentFile: KEY=value lines and comments.
func readEnvFile(p string) (map[string]string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not KEY=value", p, line)
		}
		env[k] = v
	}
	return env, nil
}

// unitCase is a unit, the instance it is checked as, and the example
// environment file the docs install for it.
type unitCase struct {
	file        string
	instance    string   // for a template: the %i the check substitutes
	envFile     string   // deploy/systemd's example of its EnvironmentFile
	credentials []string // LoadCredential= ids, each read by a -*token-file flag
}

var unitCases = []unitCase{
	{file: "allocator.service", envFile: "allocator.env", credentials: []string{"gateway-tokens"}},
	{file: "allocator@.service", instance: "a", envFile: "cluster.env", credentials: []string{"gateway-tokens", "admin-tokens", "peer-tokens"}},
}

// credentialsDir stands for ${CREDENTIALS_DIRECTORY} when the flags are
// parsed: any absolute path does.
const credentialsDir = "/run/credentials/allocator.service"

// unitProblems checks the keys the unit's hardening and wiring rely on:
// an unprivileged user, the state directory as -data-dir, each token file
// a credential, a read-only system, an environment file for the flags,
// and a stop timeout above the allocator's drain. It returns the
// allocator's invocation for the flag check.
func unitProblems(uc unitCase, text string, alloc command) ([]string, invocation) {
	var out []string
	bad := func(format string, a ...any) { out = append(out, uc.file+": "+fmt.Sprintf(format, a...)) }
	u, err := parseUnit(text)
	if err != nil {
		return []string{uc.file + ": " + err.Error()}, invocation{}
	}
	svc := "Service"
	want := map[string]string{
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"CapabilityBoundingSet":   "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
	}
	for k, v := range want {
		if got, ok := u[svc][k]; !ok || u.last(svc, k) != v {
			bad("%s=%q, want %q", k, strings.Join(got, " "), v)
		}
	}
	if u.last(svc, "DynamicUser") != "yes" && (u.last(svc, "User") == "" || u.last(svc, "User") == "root") {
		bad("runs as root: want DynamicUser=yes or a User= of its own")
	}
	if u.last(svc, "EnvironmentFile") == "" {
		bad("no EnvironmentFile= for the flags")
	}

	exec := strings.Fields(u.last(svc, "ExecStart"))
	if len(exec) == 0 || exec[0] != "/usr/local/bin/allocator" {
		bad("ExecStart does not run /usr/local/bin/allocator")
		return out, invocation{}
	}
	subst := strings.NewReplacer("${CREDENTIALS_DIRECTORY}", credentialsDir, "%i", uc.instance)
	var args []string
	for _, a := range exec[1:] {
		args = append(args, subst.Replace(a))
	}
	env, err := readEnvFile(path.Join(systemdDir, uc.envFile))
	if err != nil {
		bad("%v", err)
	}
	inv := invocation{where: uc.file + " with " + uc.envFile, args: args, env: env}
	flags, err := parseArgs(args, alloc)
	if err != nil {
		bad("ExecStart: %v", err)
		return out, inv
	}
	setting := func(name string) string { return alloc.setting(name, flags, env) }

	// The state directory is the data directory.
	state := subst.Replace(u.last(svc, "StateDirectory"))
	if state == "" || setting("data-dir") != "/var/lib/"+state {
		bad("-data-dir %q is not the StateDirectory=%s (/var/lib/%s)", setting("data-dir"), state, state)
	}
	if uc.instance != "" && setting("cluster-id") != uc.instance {
		bad("-cluster-id %q, want the instance name %%i", setting("cluster-id"))
	}

	// Each token file is a credential the unit loads.
	loaded := map[string]bool{}
	for _, lc := range u[svc]["LoadCredential"] {
		id, src, ok := strings.Cut(lc, ":")
		if !ok || !strings.HasPrefix(src, "/") {
			bad("LoadCredential=%s: want id:/absolute/path", lc)
		}
		loaded[id] = true
	}
	var read []string
	for _, flag := range []string{"token-file", "admin-token-file", "peer-token-file"} {
		p := setting(flag)
		if p == "" {
			continue
		}
		dir, id := path.Split(p)
		if path.Clean(dir) != credentialsDir || !loaded[id] {
			bad("-%s %s is not a credential the unit loads (${CREDENTIALS_DIRECTORY}/<LoadCredential id>)", flag, p)
		}
		read = append(read, id)
	}
	if !slices.Equal(read, uc.credentials) {
		bad("the token flags read credentials %q, want %q", read, uc.credentials)
	}
	if len(loaded) != len(uc.credentials) {
		bad("loads %d credentials, its flags read %d", len(loaded), len(uc.credentials))
	}

	drain, err := time.ParseDuration(setting("shutdown-timeout"))
	stop, err2 := time.ParseDuration(u.last(svc, "TimeoutStopSec"))
	if err != nil || err2 != nil || stop <= drain {
		bad("TimeoutStopSec=%s must exceed -shutdown-timeout %s", u.last(svc, "TimeoutStopSec"), setting("shutdown-timeout"))
	}
	if u.last("Install", "WantedBy") != "multi-user.target" {
		bad("not WantedBy=multi-user.target: enable would not start it at boot")
	}
	return out, inv
}

func TestSystemdUnits(t *testing.T) {
	alloc := loadCommand(t, "allocator")
	for _, uc := range unitCases {
		text, err := os.ReadFile(path.Join(systemdDir, uc.file))
		if err != nil {
			t.Fatal(err)
		}
		problems, inv := unitProblems(uc, string(text), alloc)
		if inv.where != "" {
			problems = append(problems, alloc.problems(inv)...)
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
	// The template's instance is a member the example's peers list.
	env, err := readEnvFile(path.Join(systemdDir, "cluster.env"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(env["RATION_CLUSTER_PEERS"], unitCases[1].instance+"=") {
		t.Errorf("cluster.env's peers %q do not start with member %q, which the docs install it for", env["RATION_CLUSTER_PEERS"], unitCases[1].instance)
	}
}

// TestSystemdCheckBites breaks the template the ways the check is there
// to catch and expects each to be reported.
func TestSystemdCheckBites(t *testing.T) {
	src, err := os.ReadFile(path.Join(systemdDir, unitCases[1].file))
	if err != nil {
		t.Fatal(err)
	}
	expectReported(t, unitCases[1].file, string(src), []breakage{
		{"a credential not loaded", "LoadCredential=peer-tokens:/etc/ration/peer-tokens\n", "", "not a credential the unit loads"},
		{"a token file outside the credentials", "${CREDENTIALS_DIRECTORY}/admin-tokens", "/etc/ration/admin-tokens", "not a credential the unit loads"},
		{"a data directory that is not the state directory", "-data-dir /var/lib/ration/%i", "-data-dir /srv/ration", "StateDirectory"},
		{"a writable system", "ProtectSystem=strict", "ProtectSystem=full", "ProtectSystem"},
		{"root", "DynamicUser=yes", "DynamicUser=no", "runs as root"},
		{"a stop timeout within the drain", "TimeoutStopSec=30s", "TimeoutStopSec=10s", "TimeoutStopSec"},
		{"a flag the allocator lacks", "-cluster-id %i", "-cluster-name %i", "-cluster-name is no flag"},
	}, func(src string) []string {
		problems, _ := unitProblems(unitCases[1], src, allocatorAsUsed())
		return problems
	})
}
