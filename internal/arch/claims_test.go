package arch

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	testNameRE = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")
	testFuncRE = regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
)

// TestClaimsNameRealTests holds docs/claims.md to the code: in each row of its tables, every
// test named in the test column is a test function of a package named in the package column
// (the columns' groups separated by ";" pair up in order when both have the same number), and
// every test README.md cites has a row. A renamed or moved test fails here, not in a reader's
// search.
func TestClaimsNameRealTests(t *testing.T) {
	root := "../.."
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	claims := read("docs/claims.md")

	// The test functions of each package directory (relative to the root).
	tests := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() != ".." && strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		if tests[rel] == nil {
			tests[rel] = map[string]bool{}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range testFuncRE.FindAllStringSubmatch(string(b), -1) {
			tests[rel][m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	rows := 0
	for _, line := range strings.Split(claims, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 6 || !strings.HasPrefix(line, "| ") {
			continue // not a claim | README | test | package row
		}
		testGroups, pkgGroups := strings.Split(cells[3], ";"), strings.Split(cells[4], ";")
		for i, group := range testGroups {
			pkgs := cells[4]
			if len(pkgGroups) == len(testGroups) {
				pkgs = pkgGroups[i]
			}
			for _, m := range testNameRE.FindAllStringSubmatch(group, -1) {
				rows++
				found := false
				for pkg := range strings.FieldsFuncSeq(pkgs, func(r rune) bool { return r == ',' || r == ';' || r == ' ' }) {
					found = found || tests[pkg][m[1]]
				}
				if !found {
					t.Errorf("docs/claims.md: %s is no test of %s", m[1], strings.TrimSpace(pkgs))
				}
			}
		}
	}
	if rows < 20 {
		t.Errorf("only %d tests found in docs/claims.md's tables; the pattern is out of date", rows)
	}
	for _, m := range testNameRE.FindAllStringSubmatch(read("README.md"), -1) {
		if !strings.Contains(claims, "`"+m[1]+"`") {
			t.Errorf("README.md cites %s, which docs/claims.md does not list", m[1])
		}
	}
}
