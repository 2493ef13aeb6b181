package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is returned by Load and Parse for a file that cannot be used. It holds every problem
// found, not just the first; its message lists them one per line, each naming the file and,
// where there is one, the rule or queue and the field:
//
//	sluice.yaml: rules[2] "login": period must be > 0
//	sluice.yaml: queues[0] "orders": rate: invalid rate "fast": want N/s, N/m, N/h or N/<duration>
//	sluice.yaml:7: rules[1] "search": unknown field "algoritm"
//
// Decoding problems carry the line the YAML parser reported, as "file:line:".
type Error struct {
	// File is the path of the file, as given to Load or Parse.
	File string
	// Problems holds one error per problem, in the order found.
	Problems []error
}

// Error returns the problems, one per line.
func (e *Error) Error() string { return errors.Join(e.Problems...).Error() }

// Unwrap returns the problems, so that errors.Is and errors.As look into each.
func (e *Error) Unwrap() []error { return e.Problems }

// The environment variables that override the file.
const (
	EnvRedisURL    = "SLUICE_REDIS_URL"
	EnvNATSURL     = "SLUICE_NATS_URL"
	EnvListen      = "SLUICE_LISTEN"
	EnvAdminListen = "SLUICE_ADMIN_LISTEN"
	EnvAdminToken  = "SLUICE_ADMIN_TOKEN"
	EnvIDSecret    = "SLUICE_ID_SECRET"
)

// Load reads the file at path and returns its Config, with the process environment's
// overrides applied (see Parse). It returns the error of reading the file, or an *Error that
// lists every problem of its content.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data, os.Getenv)
}

// Parse decodes data, the content of the file at path, into a Config. path is used only to
// name the file in errors and as Config.Path.
//
// Decoding is strict: unknown keys are errors, and so are an empty file and a file with more
// than one YAML document. The environment, looked up with getenv (nil: no environment),
// overrides the file where a variable is set and non-empty: SLUICE_REDIS_URL sets Redis.URL
// (creating Redis), SLUICE_NATS_URL sets NATS.URL (creating NATS), SLUICE_LISTEN sets Listen,
// SLUICE_ADMIN_LISTEN sets AdminListen. Then defaults are filled in and the result validated.
//
// Parse returns either a valid Config or an *Error listing every problem; it does not panic,
// whatever data holds.
func Parse(path string, data []byte, getenv func(string) string) (*Config, error) {
	p := &problems{file: path, seen: map[string]bool{}}
	raw, ok := decode(p, data)
	if !ok {
		return nil, p.err()
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	cfg := build(p, path, raw, getenv)
	if err := p.err(); err != nil {
		return nil, err
	}
	cfg.source = bytes.Clone(data)
	return cfg, nil
}

// problems collects the problems of one file. At most one problem is kept per field of a
// place: a value that failed to parse is not reported again as out of range.
type problems struct {
	file string
	errs []error
	seen map[string]bool
}

// add records a problem at where (`rules[2] "login"`, or "" for the top level) about field
// ("" when the problem is about no one field). msg is the text after the place.
func (p *problems) add(where, field, msg string) {
	if field != "" {
		k := where + "\x00" + field
		if p.seen[k] {
			return
		}
		p.seen[k] = true
	}
	s := p.file + ": "
	if where != "" {
		s += where + ": "
	}
	p.errs = append(p.errs, errors.New(s+msg))
}

// addf is add with a format.
func (p *problems) addf(where, field, format string, args ...any) {
	p.add(where, field, fmt.Sprintf(format, args...))
}

// atLine records a decoding problem at a line of the file (0: unknown).
func (p *problems) atLine(line int, where, msg string) {
	s := p.file
	if line > 0 {
		s += ":" + strconv.Itoa(line)
	}
	s += ": "
	if where != "" {
		s += where + ": "
	}
	// One problem, one line: a value quoted by YAML may hold line breaks.
	p.errs = append(p.errs, errors.New(s+strings.ReplaceAll(msg, "\n", `\n`)))
}

func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return &Error{File: p.file, Problems: p.errs}
}

// The raw file. Single values are decoded as their text and parsed by build, so that a value
// of the wrong type or shape is reported with its field, and all such problems at once; a nil
// pointer means the key is absent or null.
type (
	rawConfig struct {
		Listen          *scalar     `yaml:"listen"`
		AdminListen     *scalar     `yaml:"admin_listen"`
		Upstream        *scalar     `yaml:"upstream"`
		TrustedProxies  stringList  `yaml:"trusted_proxies"`
		DataDir         *scalar     `yaml:"data_dir"`
		DemoUpstream    *scalar     `yaml:"demo_upstream"`
		Redis           *rawRedis   `yaml:"redis"`
		NATS            *rawNATS    `yaml:"nats"`
		OnStoreError    *scalar     `yaml:"on_store_error"`
		Shadow          *scalar     `yaml:"shadow"`
		LogDecisions    *scalar     `yaml:"log_decisions"`
		StoreTimeout    *scalar     `yaml:"store_timeout"`
		ShutdownTimeout *scalar     `yaml:"shutdown_timeout"`
		JobRetention    *scalar     `yaml:"job_retention"`
		MaxHeaderBytes  *scalar     `yaml:"max_header_bytes"`
		ReadTimeout     *scalar     `yaml:"read_timeout"`
		ReadAheadBytes  *scalar     `yaml:"read_ahead_bytes"`
		IPv6Prefix      *scalar     `yaml:"ipv6_prefix"`
		AdminToken      *scalar     `yaml:"admin_token"`
		AdminHosts      stringList  `yaml:"admin_hosts"`
		FormatSuffixes  *stringList `yaml:"format_suffixes"`
		IDSecret        *scalar     `yaml:"id_secret"`
		Tracing         *rawTracing `yaml:"tracing"`
		Worker          *rawWorker  `yaml:"worker"`
		Region          *scalar     `yaml:"region"`
		Regions         *rawRegions `yaml:"regions"`
		Queues          []rawQueue  `yaml:"queues"`
		Rules           []rawRule   `yaml:"rules"`
		RLSListen       *scalar     `yaml:"rls_listen"`
		RLS             *rawRLS     `yaml:"rls"`
	}
	rawRLS struct {
		ConfigDir  *scalar `yaml:"config_dir"`
		Reflection *scalar `yaml:"reflection"`
	}
	rawRedis struct {
		URL *scalar `yaml:"url"`
	}
	rawTracing struct {
		OTLP        *scalar `yaml:"otlp"`
		SampleRatio *scalar `yaml:"sample_ratio"`
	}
	rawNATS struct {
		URL           *scalar `yaml:"url"`
		Replicas      *scalar `yaml:"replicas"`
		StoreBudget   *scalar `yaml:"store_budget"`
		SharedStreams *scalar `yaml:"shared_streams"`
		JSDomain      *scalar `yaml:"jetstream_domain"`
	}
	rawQueue struct {
		Name             *scalar                       `yaml:"name"`
		Rate             *scalar                       `yaml:"rate"`
		Burst            *scalar                       `yaml:"burst"`
		MaxDepth         *scalar                       `yaml:"max_depth"`
		MaxBodyBytes     *scalar                       `yaml:"max_body_bytes"`
		MaxBytes         *scalar                       `yaml:"max_bytes"`
		Target           *scalar                       `yaml:"target"`
		MaxAttempts      *scalar                       `yaml:"max_attempts"`
		Backoff          *rawBackoff                   `yaml:"backoff"`
		Timeout          *scalar                       `yaml:"timeout"`
		DedupeWindow     *scalar                       `yaml:"dedupe_window"`
		AckWait          *scalar                       `yaml:"ack_wait"`
		Concurrency      *scalar                       `yaml:"concurrency"`
		MaxPauseRetries  *scalar                       `yaml:"max_pause_retries"`
		Tenant           stringList                    `yaml:"tenant"`
		Adaptive         *scalar                       `yaml:"adaptive"`
		MinRate          *scalar                       `yaml:"min_rate"`
		Fair             *scalar                       `yaml:"fair"`
		FairBy           *scalar                       `yaml:"fair_by"`
		Weights          scalarMap                     `yaml:"weights"`
		TenantRate       *scalar                       `yaml:"tenant_rate"`
		MaxInFlight      *scalar                       `yaml:"max_in_flight"`
		TenantInFlight   *scalar                       `yaml:"tenant_in_flight"`
		PauseScope       *scalar                       `yaml:"pause_scope"`
		TenantMaxDepth   *scalar                       `yaml:"tenant_max_depth"`
		TenantSettings   map[string]*rawTenantSettings `yaml:"tenant_settings"`
		Cost             *scalar                       `yaml:"cost"`
		CostFallback     *scalar                       `yaml:"cost_fallback"`
		CostRate         *scalar                       `yaml:"cost_rate"`
		CostBurst        *scalar                       `yaml:"cost_burst"`
		CostFromResponse *scalar                       `yaml:"cost_from_response"`
		Budgets          []rawQueueBudget              `yaml:"budgets"`
		MaxDelay         *scalar                       `yaml:"max_delay"`
		Priorities       *rawPriorities                `yaml:"priorities"`
		Global           *scalar                       `yaml:"global"`
	}
	rawTenantSettings struct {
		Label    *scalar `yaml:"label"`
		Weight   *scalar `yaml:"weight"`
		Rate     *scalar `yaml:"rate"`
		InFlight *scalar `yaml:"in_flight"`
	}
	rawBackoff struct {
		Initial *scalar `yaml:"initial"`
		Max     *scalar `yaml:"max"`
	}
	rawRule struct {
		Name             *scalar     `yaml:"name"`
		Match            *rawMatch   `yaml:"match"`
		Key              stringList  `yaml:"key"`
		Algorithm        *scalar     `yaml:"algorithm"`
		Limit            *scalar     `yaml:"limit"`
		Period           *scalar     `yaml:"period"`
		Burst            *scalar     `yaml:"burst"`
		OnLimit          *scalar     `yaml:"on_limit"`
		Action           *scalar     `yaml:"action"`
		Queue            *scalar     `yaml:"queue"`
		MaxWaitingPerKey *scalar     `yaml:"max_waiting_per_key"`
		Shadow           *scalar     `yaml:"shadow"`
		Global           *scalar     `yaml:"global"`
		OnStoreError     *scalar     `yaml:"on_store_error"`
		OnStoreReset     *scalar     `yaml:"on_store_reset"`
		Lease            *scalar     `yaml:"lease"`
		Timeout          *scalar     `yaml:"timeout"`
		Cost             *scalar     `yaml:"cost"`
		CostFallback     *scalar     `yaml:"cost_fallback"`
		CostFromResponse *scalar     `yaml:"cost_from_response"`
		CostOnCut        *scalar     `yaml:"cost_on_cut"`
		CutOnDebt        *scalar     `yaml:"cut_on_debt"`
		Budgets          []rawBudget `yaml:"budgets"`
	}
	rawBudget struct {
		Name             *scalar `yaml:"name"`
		Algorithm        *scalar `yaml:"algorithm"`
		Limit            *scalar `yaml:"limit"`
		Period           *scalar `yaml:"period"`
		Burst            *scalar `yaml:"burst"`
		Cost             *scalar `yaml:"cost"`
		CostFallback     *scalar `yaml:"cost_fallback"`
		CostFromResponse *scalar `yaml:"cost_from_response"`
	}
	rawMatch struct {
		Methods         stringList `yaml:"methods"`
		Path            *scalar    `yaml:"path"`
		CaseInsensitive *scalar    `yaml:"case_insensitive"`
	}
)

// scalar is a single value of the file, as its text. When the file holds a list or a
// mapping instead, shape says which and build reports it with the field's name.
type scalar struct {
	text  string
	shape string
}

// UnmarshalYAML implements yaml.Unmarshaler. It never fails: see shape.
func (s *scalar) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = scalar{text: n.Value}
	} else {
		*s = scalar{shape: kindName(n.Kind)}
	}
	return nil
}

// stringList is a list of single values; a single value stands for a list of one. When the
// file holds a mapping instead, shape says so.
type stringList struct {
	items []scalar
	shape string
}

// UnmarshalYAML implements yaml.Unmarshaler. It never fails: see shape.
func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = stringList{items: []scalar{{text: n.Value}}}
	case yaml.SequenceNode:
		*l = stringList{items: make([]scalar, len(n.Content))}
		for i, c := range n.Content {
			_ = l.items[i].UnmarshalYAML(c) // never fails
		}
	default:
		*l = stringList{shape: kindName(n.Kind)}
	}
	return nil
}

// scalarMap is a mapping of single values, in file order. When the file holds something
// else, shape says so.
type scalarMap struct {
	keys  []string
	vals  []scalar
	shape string
}

// UnmarshalYAML implements yaml.Unmarshaler. It never fails: see shape.
func (m *scalarMap) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		*m = scalarMap{shape: kindName(n.Kind)}
		return nil
	}
	*m = scalarMap{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		var v scalar
		_ = v.UnmarshalYAML(n.Content[i+1]) // never fails
		m.keys, m.vals = append(m.keys, n.Content[i].Value), append(m.vals, v)
	}
	return nil
}

// kindName describes a kind of node as a message says it.
func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return "a single value"
	}
}

var (
	// yamlLine is the "line N: " that yaml.v3 starts its messages with.
	yamlLine = regexp.MustCompile(`(?s)^line (\d+): (.*)$`)
	// unknownField is yaml.v3's message for an unknown key under KnownFields.
	unknownField = regexp.MustCompile(`^field (.*) not found in type (\S+)$`)
	// wrongShape is yaml.v3's message for a value of the wrong kind.
	wrongShape = regexp.MustCompile("(?s)^cannot unmarshal !!(\\w+)(?: `.*`)? into (\\S+)$")
)

// fieldOf names the key of the file that yaml.v3 decodes into a raw type, and what it wants
// there. Single values and lists of them never fail to decode (see scalar), so only the
// mappings and the lists of mappings remain.
var fieldOf = map[string]struct{ field, want string }{
	"config.rawConfig":  {"", "a mapping"},
	"[]config.rawQueue": {"queues", "a list"},
	"[]config.rawRule":  {"rules", "a list"},
	"config.rawQueue":   {"", "a mapping"},
	"config.rawRule":    {"", "a mapping"},
	"config.rawRedis":   {"redis", "a mapping"},
	"config.rawNATS":    {"nats", "a mapping"},
	"config.rawTracing": {"tracing", "a mapping"},
	"config.rawWorker":  {"worker", "a mapping"},
	"config.rawRegions": {"regions", "a mapping"},
	"config.rawBackoff": {"backoff", "a mapping"},
	"config.rawMatch":   {"match", "a mapping"},
}

// decode parses data into the raw file, reporting syntax errors, unknown fields and values of
// the wrong shape with the line YAML gives. ok is false when there is nothing to build from.
func decode(p *problems, data []byte) (raw *rawConfig, ok bool) {
	defer func() {
		// yaml.v3 reports errors by panicking internally and recovering; should one
		// escape, it is a problem of the file, never a crash of the process.
		if r := recover(); r != nil {
			p.atLine(0, "", fmt.Sprintf("cannot decode YAML: %v", r))
			raw, ok = nil, false
		}
	}()

	// The document tree locates decoding errors in rules and queues.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		addYAMLError(p, nil, err)
		return nil, false
	}
	if isEmpty(&doc) {
		p.atLine(0, "", "file is empty")
		return nil, false
	}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	raw = &rawConfig{}
	err := dec.Decode(raw)
	var te *yaml.TypeError
	switch {
	case errors.As(err, &te):
		// yaml.v3 decodes what it can around type errors: go on and report the rest too.
		addYAMLError(p, &doc, err)
	case err != nil:
		addYAMLError(p, &doc, err)
		return nil, false
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		p.atLine(next.Line, "", "more than one YAML document in the file")
	} else if err != io.EOF {
		addYAMLError(p, &doc, err)
	}
	return raw, true
}

// isEmpty reports whether doc holds no value: an empty file, only comments, or a null.
func isEmpty(doc *yaml.Node) bool {
	if doc.Kind == 0 {
		return true
	}
	if doc.Kind == yaml.DocumentNode {
		return len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null"
	}
	return false
}

// addYAMLError turns an error of yaml.v3 into problems with the file and line.
func addYAMLError(p *problems, doc *yaml.Node, err error) {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		for _, msg := range te.Errors {
			addYAMLMessage(p, doc, msg)
		}
		return
	}
	addYAMLMessage(p, doc, err.Error())
}

func addYAMLMessage(p *problems, doc *yaml.Node, msg string) {
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	where := locate(doc, line)
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown field %q", m[1])
		if f := fieldOf[m[2]].field; f != "" {
			msg = f + ": " + msg
		}
	} else if m := wrongShape.FindStringSubmatch(msg); m != nil {
		into := fieldOf[m[2]]
		if into.want == "" {
			into.want = "another kind of value"
		}
		msg = fmt.Sprintf("want %s, not %s", into.want, tagName(m[1]))
		if into.field != "" {
			msg = into.field + ": " + msg
		}
	}
	p.atLine(line, where, msg)
}

// tagName describes a YAML tag's short name ("seq", "map", "str") as a message says it.
func tagName(tag string) string {
	switch tag {
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	default:
		return "a single value"
	}
}

// locate names the rule or queue that holds line, as `rules[1] "search"`, or "" outside
// them: the one of the deepest key on that line, else the last item of the rules or queues
// list that starts at or before it.
func locate(doc *yaml.Node, line int) string {
	if doc == nil || line <= 0 || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return ""
	}
	top := doc.Content[0]
	path := keyPathAt(top, line, nil)
	if len(path) < 2 {
		path = itemAt(top, line)
	}
	if len(path) < 2 {
		return ""
	}
	section, _ := path[0].(string)
	i, ok := path[1].(int)
	if !ok || (section != "rules" && section != "queues") {
		return ""
	}
	where := fmt.Sprintf("%s[%d]", section, i)
	if seq := mapValue(top, section); seq != nil && seq.Kind == yaml.SequenceNode && i < len(seq.Content) {
		if name := mapValue(seq.Content[i], "name"); name != nil && name.Kind == yaml.ScalarNode && name.Value != "" {
			where += fmt.Sprintf(" %q", name.Value)
		}
	}
	return where
}

// keyPathAt returns the path (keys as strings, list indexes as ints) of the deepest mapping
// key below n that starts on line, or nil.
func keyPathAt(n *yaml.Node, line int, path []any) []any {
	var best []any
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Line > line && v.Line > line {
				continue
			}
			p := append(append([]any(nil), path...), k.Value)
			if k.Line == line && len(p) > len(best) {
				best = p
			}
			if deeper := keyPathAt(v, line, p); len(deeper) > len(best) {
				best = deeper
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if deeper := keyPathAt(c, line, append(append([]any(nil), path...), i)); len(deeper) > len(best) {
				best = deeper
			}
		}
	}
	return best
}

// itemAt returns the path of the rule or queue that holds line: the last item of its list
// that starts at or before it.
func itemAt(top *yaml.Node, line int) []any {
	for _, section := range []string{"rules", "queues"} {
		seq := mapValue(top, section)
		if seq == nil || seq.Kind != yaml.SequenceNode || len(seq.Content) == 0 || seq.Content[0].Line > line {
			continue
		}
		// The section must be the last top-level value starting at or before line.
		if next := nextKeyLine(top, section); next > 0 && next <= line {
			continue
		}
		var path []any
		for i, item := range seq.Content {
			if item.Line <= line {
				path = []any{section, i}
			}
		}
		return path
	}
	return nil
}

// nextKeyLine returns the line of the first top-level key after section's that starts
// below it, or 0.
func nextKeyLine(top *yaml.Node, section string) int {
	start := 0
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == section {
			start = top.Content[i].Line
		}
	}
	next := 0
	for i := 0; i+1 < len(top.Content); i += 2 {
		if l := top.Content[i].Line; l > start && (next == 0 || l < next) {
			next = l
		}
	}
	return next
}

// mapValue returns the value of key in the mapping m, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
