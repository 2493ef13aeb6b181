package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

var (
	// heredocRE is a config file the README writes with cat > FILE <<'EOF'.
	heredocRE = regexp.MustCompile(`(?s)cat > (\S+\.yaml) <<'EOF'\n(.*?)\nEOF\n`)
	// readmeKeyRE is a backquoted config key in the README's prose: a snake_case or dotted
	// name (`max_in_flight`, `nats.shared_streams`), alone or as `key: value`.
	readmeKeyRE = regexp.MustCompile("`([a-z]+(?:[_.][a-z]+)+|[a-z]+)(?::[^`]*)?`")
)

// notKeys are the backquoted key-like words of the README that are not Sluice's config keys:
// fields of the LLM APIs' request bodies, which the README quotes, and a cost's source (`json:`).
var notKeys = map[string]bool{"include_usage": true, "max_tokens": true, "max_completion_tokens": true, "json": true}

// TestReadmeConfigKeys holds README.md to the decoder: every config file it writes decodes
// strictly (an unknown or misspelt key, or a bad value, fails naming it), and every config
// key its prose names in backquotes (snake_case or dotted, or written `key: value`) is a key
// of the top level, a queue or a rule, in full or as its last part (`renew` for
// regions.renew).
func TestReadmeConfigKeys(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)

	files := heredocRE.FindAllStringSubmatch(readme, -1)
	if len(files) == 0 {
		t.Fatal("README.md writes no config file (cat > FILE.yaml <<'EOF'); the pattern is out of date")
	}
	for _, f := range files {
		if _, err := Parse(f[1], []byte(f[2]), func(string) string { return "" }); err != nil {
			t.Errorf("README.md's %s does not load: %v", f[1], err)
		}
	}

	keys := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeOf(rawConfig{}), reflect.TypeOf(rawQueue{}), reflect.TypeOf(rawRule{})} {
		all := map[string]bool{}
		yamlKeys(typ, "", all)
		for k := range all {
			keys[k] = true
			for part := range strings.SplitSeq(k, ".") {
				keys[part] = true // a section's name, and a key named by its last part
			}
		}
	}
	keys["queues"], keys["rules"] = true, true

	prose := fenceRE.ReplaceAllString(readme, "")
	checked := 0
	for _, m := range readmeKeyRE.FindAllStringSubmatch(prose, -1) {
		word, full := m[1], m[0]
		keyLike := strings.ContainsAny(word, "_.") || strings.Contains(full, ":")
		if !keyLike || notKeys[word] {
			continue
		}
		checked++
		if !keys[word] {
			t.Errorf("README.md names %s, which is no config key (internal/config: rawConfig, rawQueue, rawRule)", full)
		}
	}
	if checked < 10 {
		t.Errorf("only %d config keys found in README.md's prose; the pattern is out of date", checked)
	}
}

// fenceRE is a fenced code block.
var fenceRE = regexp.MustCompile("(?s)```.*?```")
