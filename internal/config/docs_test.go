package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestEveryKeyDocumented holds docs/configuration.md to the decoder: every key the file may
// contain is a row of the reference table of its section (top level, queues, rules), and every
// row names a key that exists, so a key added without a description, or one renamed, fails.
func TestEveryKeyDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := referenceRows(string(b))
	sections := map[string]reflect.Type{
		"Top-level keys": reflect.TypeOf(rawConfig{}),
		"Queue keys":     reflect.TypeOf(rawQueue{}),
		"Rule keys":      reflect.TypeOf(rawRule{}),
	}
	for section, typ := range sections {
		rows, ok := documented[section]
		if !ok {
			t.Errorf("docs/configuration.md has no %q table", section)
			continue
		}
		want := map[string]bool{}
		yamlKeys(typ, "", want)
		sections := map[string]bool{} // a section's own name may be a row too (priorities: true)
		for k := range want {
			for i := range k {
				if k[i] == '.' {
					sections[k[:i]] = true
				}
			}
		}
		for k := range want {
			if !rows[k] {
				t.Errorf("docs/configuration.md, %s: key %q is not described (add a row: key | type | default | meaning)", section, k)
			}
		}
		for k := range rows {
			if !want[k] && !sections[k] {
				t.Errorf("docs/configuration.md, %s: row %q names no key of the config", section, k)
			}
		}
	}
}

// yamlKeys adds the dotted names of typ's yaml keys to into: a mapping's entries are named
// <value>, a section's own name is not a row, lists of sections (queues, rules) are left to their own tables.
func yamlKeys(typ reflect.Type, prefix string, into map[string]bool) {
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "queues" || name == "rules" {
			continue
		}
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct && ft.Elem() != reflect.TypeOf(scalar{}):
			n := len(into)
			yamlKeys(ft.Elem(), prefix+name+".", into) // a section: its keys are the rows
			if len(into) == n {
				into[prefix+name] = true // decoded by hand (rawPriorities): one row
			}
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Pointer && ft.Elem().Elem().Kind() == reflect.Struct:
			into[prefix+name] = true
			yamlKeys(ft.Elem().Elem(), prefix+name+".<value>.", into)
		default:
			into[prefix+name] = true
		}
	}
}

var (
	sectionRE = regexp.MustCompile(`(?m)^## ([A-Z][a-z-]+ keys)`)
	codeRE    = regexp.MustCompile("`([^`]+)`")
)

// referenceRows returns, per "## ... keys" section, the keys named in backquotes in the first
// cell of its table's rows.
func referenceRows(doc string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	locs := sectionRE.FindAllStringSubmatchIndex(doc, -1)
	for i, loc := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		body := doc[loc[1]:end]
		if j := strings.Index(body, "\n## "); j >= 0 {
			body = body[:j]
		}
		rows := map[string]bool{}
		for _, l := range strings.Split(body, "\n") {
			cells := strings.Split(l, "|")
			if len(cells) < 3 || !strings.HasPrefix(l, "| `") {
				continue
			}
			for _, m := range codeRE.FindAllStringSubmatch(cells[1], -1) {
				rows[m[1]] = true
			}
		}
		out[doc[loc[2]:loc[3]]] = rows
	}
	return out
}
