package app

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// quickstartLine is one command of the README's quickstart with the output it promises.
type quickstartLine struct {
	cmd    string
	exact  string         // "# => TEXT": the trimmed output is TEXT
	match  *regexp.Regexp // "# ~> REGEXP": the output matches
	within time.Duration  // "(within Ns)": the output may take that long to appear
}

var (
	expectRE = regexp.MustCompile(`^(.*?)\s+# (=>|~>) (.*?)(?: \(within (\d+s)\))?$`)
	assignRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=\$\(`)
)

// readmeQuickstart returns the command lines between the quickstart markers of README.md.
func readmeQuickstart(t *testing.T) []quickstartLine {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- quickstart:begin -->")
	block, _, ok2 := strings.Cut(rest, "<!-- quickstart:end -->")
	if !ok || !ok2 {
		t.Fatal("README.md has no quickstart:begin/end markers")
	}
	var lines []quickstartLine
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "```") {
			continue
		}
		m := expectRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("README quickstart line has no '# =>' or '# ~>' expectation: %s", l)
		}
		ql := quickstartLine{cmd: m[1]}
		if m[2] == "=>" {
			ql.exact = m[3]
		} else {
			ql.match = regexp.MustCompile(m[3])
		}
		if m[4] != "" {
			ql.within, _ = time.ParseDuration(m[4])
		}
		lines = append(lines, ql)
	}
	if len(lines) < 5 {
		t.Fatalf("README quickstart has only %d checked lines", len(lines))
	}
	return lines
}

// TestReadmeQuickstart runs the README's quickstart lines, as written, against the quickstart
// config (on free ports instead of the README's fixed ones) and checks what each prints.
func TestReadmeQuickstart(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if testenv.Strict() {
			t.Fatal("curl is needed to run the README's quickstart lines")
		}
		t.Skip("curl not installed")
	}
	dir := t.TempDir()
	cfg, addrs := quickstart(t, dir)
	start(t, dir, cfg)

	state := filepath.Join(dir, "vars.sh")
	os.WriteFile(state, nil, 0o644)
	for _, l := range readmeQuickstart(t) {
		cmd := addrs.Replace(l.cmd)
		script := "set -o pipefail; source " + state + "\n" + cmd
		if m := assignRE.FindStringSubmatch(cmd); m != nil {
			script += "\ndeclare -p " + m[1] + " >> " + state
		}
		deadline := time.Now().Add(l.within)
		for {
			out, err := exec.Command("bash", "-c", script).CombinedOutput()
			got := strings.TrimSpace(string(out))
			ok := err == nil && (l.match == nil && got == l.exact || l.match != nil && l.match.MatchString(got))
			if ok {
				t.Logf("ok: %s\n    %s", l.cmd, got)
				break
			}
			if time.Now().After(deadline) {
				want := l.exact
				if l.match != nil {
					want = "~ " + l.match.String()
				}
				t.Fatalf("README line\n  %s\nprinted\n  %s (err %v)\nwant\n  %s", l.cmd, got, err, want)
			}
			time.Sleep(100 * time.Millisecond) // polling the job until it reaches the promised state
		}
	}
}

// TestReadmeSDKCompiles builds the SDK page's program (docs/sdk.md) as written, in a directory
// inside this module so that its import of the client resolves to this tree.
func TestReadmeSDKCompiles(t *testing.T) {
	b, err := os.ReadFile("../../docs/sdk.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- sdk:begin -->")
	block, _, ok2 := strings.Cut(rest, "<!-- sdk:end -->")
	if !ok || !ok2 {
		t.Fatal("docs/sdk.md has no sdk:begin/end markers")
	}
	src := strings.TrimSpace(block)
	src = strings.TrimPrefix(src, "```go")
	src = strings.TrimSuffix(src, "```")
	dir, err := os.MkdirTemp("..", "readme-sdk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "vet", "./"+filepath.Base(dir))
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the SDK page's program does not build: %v\n%s\n%s", err, out, src)
	}
}
