package rls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/limit"
)

// The domain-file format of envoyproxy/ratelimit, read as it is, plus one key of Sluice's
// own (rule). Unknown keys are errors, as they are there.
type (
	rawDomain struct {
		Domain      string          `yaml:"domain"`
		Descriptors []rawDescriptor `yaml:"descriptors"`
	}
	rawDescriptor struct {
		Key            string          `yaml:"key"`
		Value          string          `yaml:"value"`
		RateLimit      *rawRateLimit   `yaml:"rate_limit"`
		Descriptors    []rawDescriptor `yaml:"descriptors"`
		ShadowMode     bool            `yaml:"shadow_mode"`
		QuotaMode      bool            `yaml:"quota_mode"`
		DetailedMetric bool            `yaml:"detailed_metric"`
		ValueToMetric  bool            `yaml:"value_to_metric"`
		ShareThreshold bool            `yaml:"share_threshold"`
		// Rule names one of the config's rules, whose limit (any algorithm), shadow and
		// on_store_error then apply to this descriptor. Sluice's own key.
		Rule string `yaml:"rule"`
	}
	rawRateLimit struct {
		Unit            string       `yaml:"unit"`
		RequestsPerUnit *int64       `yaml:"requests_per_unit"`
		Unlimited       bool         `yaml:"unlimited"`
		Name            string       `yaml:"name"`
		Replaces        []rawReplace `yaml:"replaces"`
	}
	rawReplace struct {
		Name string `yaml:"name"`
	}
)

// units are the rate_limit units of the format, with the lengths envoyproxy/ratelimit gives
// them (a month is 30 days, a year 365).
var units = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
	"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
}

// Domains is a set of domain files, compiled: what ShouldRateLimit matches against. It is
// never changed once built; a reload builds a new one.
type Domains struct {
	byName map[string]*node
	// rules are the names of the config's rules that descriptors use, for Check.
	rules map[string]string // rule name -> where it is used (file: path)
}

// node is one level of a domain's descriptor tree: its children by "key_value" or "key", and
// the wildcard keys among them ("key_prefix*"), in file order.
type node struct {
	children  map[string]*node
	wildcards []string
	lim       *policy // nil: no limit at this depth
	share     bool    // share_threshold: the values a wildcard matches count together
}

// policy is the limit a descriptor carries.
type policy struct {
	name      string // rate_limit.name: what replaces refers to; "" without one
	label     string // the rule label of the metrics
	sfLabel   string // label as a structured-field string, for the RateLimit headers
	spec      limit.Limit
	unlimited bool
	shadow    bool
	quota     bool   // quota_mode: over the limit is OK, reported in dynamic_metadata
	rule      string // a Sluice rule backs it; spec then comes from the current config
	replaces  []string
	reqs      int64 // requests_per_unit as written
	unit      string
	// overrideLimit and overridePeriod are a request descriptor's own limit (override);
	// overridePeriod is 0 without one.
	overrideLimit  int64
	overridePeriod time.Duration
	// cl holds the current_limit answered for the latest spec (currentLimit); nil: built
	// for each answer (an override's policy, which lives for one call).
	cl *limitCache
}

// limitCache is a policy's current_limit, shared by the copies of the policy.
type limitCache struct{ atomic.Pointer[cachedLimit] }

// newPolicy returns p with its label's structured-field form and a current_limit cache.
func newPolicy(p *policy) *policy {
	p.sfLabel, p.cl = httphdr.SFString(p.label), &limitCache{}
	return p
}

// LoadDir reads every *.yaml and *.yml file of dir (not subdirectories) and compiles them,
// checking the rules descriptors name against cfg. It returns an error that names the file and
// the field of every problem found.
func LoadDir(dir string, cfg *config.Config) (*Domains, error) {
	var names []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, fmt.Errorf("rls: config_dir %s: %w", dir, err)
		}
		names = append(names, m...)
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("rls: config_dir: %w", err)
	}
	slices.Sort(names)
	files := make(map[string][]byte, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
		files[n] = data
	}
	return Compile(files, cfg)
}

// Compile compiles domain files, by file name. Errors name the file and the field.
func Compile(files map[string][]byte, cfg *config.Config) (*Domains, error) {
	d := &Domains{byName: map[string]*node{}, rules: map[string]string{}}
	seen := map[string]string{} // domain -> file
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var errs []error
	for _, file := range names {
		var raw rawDomain
		dec := yaml.NewDecoder(bytes.NewReader(files[file]))
		dec.KnownFields(true)
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("empty file")
			}
			errs = append(errs, decodeErrors(file, err)...)
			continue
		}
		c := &compiler{file: file, domain: raw.Domain, cfg: cfg, d: d}
		switch {
		case raw.Domain == "":
			c.fail("domain", "required")
		case seen[raw.Domain] != "":
			c.fail("domain", fmt.Sprintf("duplicate domain %q (also in %s)", raw.Domain, seen[raw.Domain]))
		default:
			seen[raw.Domain] = file
			d.byName[raw.Domain] = c.level("descriptors", raw.Descriptors, raw.Domain)
		}
		errs = append(errs, c.errs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return d, nil
}

// compiler compiles one file, collecting its problems.
type compiler struct {
	file, domain string
	cfg          *config.Config
	d            *Domains
	errs         []error
}

func (c *compiler) fail(field, msg string) {
	c.errs = append(c.errs, fmt.Errorf("%s: domain %q: %s: %s", c.file, c.domain, field, msg))
}

// level compiles the descriptors at one depth; at names them in errors, path in metrics.
func (c *compiler) level(at string, ds []rawDescriptor, path string) *node {
	n := &node{children: map[string]*node{}}
	for i, rd := range ds {
		where := fmt.Sprintf("%s[%d]", at, i)
		if rd.Key == "" {
			c.fail(where+".key", "required")
			continue
		}
		k := rd.Key
		if rd.Value != "" {
			k += "_" + rd.Value
		}
		if _, dup := n.children[k]; dup {
			c.fail(where, fmt.Sprintf("duplicate descriptor %q at this depth", k))
			continue
		}
		sub := path + "." + k
		child := c.level(where+".descriptors", rd.Descriptors, sub)
		child.lim, child.share = c.policy(where, rd, sub), rd.ShareThreshold
		n.children[k] = child
		if strings.HasSuffix(k, "*") {
			n.wildcards = append(n.wildcards, k)
		}
	}
	return n
}

// policy compiles a descriptor's rate_limit or rule; nil when it has neither.
func (c *compiler) policy(where string, rd rawDescriptor, path string) *policy {
	rl := rd.RateLimit
	if rd.Rule != "" {
		return c.rulePolicy(where, rd)
	}
	if rl == nil {
		return nil
	}
	p := &policy{name: rl.Name, label: "rls:" + path, unlimited: rl.Unlimited, shadow: rd.ShadowMode, quota: rd.QuotaMode,
		replaces: c.replaces(where, rl), unit: rl.Unit}
	if rl.Name != "" {
		p.label = rl.Name
	}
	newPolicy(p)
	if rl.Unlimited {
		if rl.Unit != "" || rl.RequestsPerUnit != nil {
			c.fail(where+".rate_limit.unlimited", "an unlimited rate_limit takes no unit or requests_per_unit")
		}
		return p
	}
	period, ok := units[strings.ToLower(rl.Unit)]
	if !ok {
		c.fail(where+".rate_limit.unit", fmt.Sprintf("invalid unit %q: want second, minute, hour, day, week, month or year", rl.Unit))
	}
	switch {
	case rl.RequestsPerUnit == nil:
		c.fail(where+".rate_limit.requests_per_unit", "required (or unlimited: true)")
	case *rl.RequestsPerUnit < 0 || *rl.RequestsPerUnit > 1<<32-1:
		c.fail(where+".rate_limit.requests_per_unit", fmt.Sprintf("%d: want 0 to 4294967295", *rl.RequestsPerUnit))
	default:
		p.reqs = *rl.RequestsPerUnit
	}
	p.spec = limit.Limit{Algorithm: limit.FixedWindow, Limit: p.reqs, Period: period}
	if err := p.spec.Validate(); ok && p.reqs > 0 && err != nil {
		c.fail(where+".rate_limit", err.Error())
	}
	return p
}

// rulePolicy compiles a descriptor that names one of the config's rules. A rate_limit beside
// it may give a name and replaces, not a rate.
func (c *compiler) rulePolicy(where string, rd rawDescriptor) *policy {
	rl := rd.RateLimit
	if rl != nil && (rl.Unit != "" || rl.RequestsPerUnit != nil || rl.Unlimited) {
		c.fail(where+".rule", "a descriptor takes rule or a rate_limit with unit and requests_per_unit, not both")
		return nil
	}
	p := newPolicy(&policy{rule: rd.Rule, label: rd.Rule, shadow: rd.ShadowMode, quota: rd.QuotaMode})
	if rl != nil {
		p.name, p.replaces = rl.Name, c.replaces(where, rl)
	}
	if err := ruleUsable(c.cfg, rd.Rule); err != nil {
		c.fail(where+".rule", err.Error())
	}
	c.d.rules[rd.Rule] = c.file + ": " + where
	return p
}

// replaces returns the names rl replaces, each required.
func (c *compiler) replaces(where string, rl *rawRateLimit) []string {
	var out []string
	for i, r := range rl.Replaces {
		if r.Name == "" {
			c.fail(fmt.Sprintf("%s.rate_limit.replaces[%d].name", where, i), "required")
		}
		out = append(out, r.Name)
	}
	return out
}

// ruleUsable reports why the rule called name of cfg cannot sit behind a descriptor.
func ruleUsable(cfg *config.Config, name string) error {
	i := slices.IndexFunc(cfg.Rules, func(r config.Rule) bool { return r.Name == name })
	switch {
	case i < 0:
		return fmt.Errorf("no rule %q in %s", name, cfg.Path)
	case len(cfg.Rules[i].Budgets) > 0:
		return fmt.Errorf("rule %q has budgets, which ShouldRateLimit does not charge separately", name)
	case cfg.Rules[i].Concurrency():
		return fmt.Errorf("rule %q caps requests in flight (algorithm: concurrency), which ShouldRateLimit cannot release", name)
	case !cfg.Rules[i].HasLimit():
		return fmt.Errorf("rule %q has no limit (action: enqueue without an algorithm)", name)
	}
	return nil
}

// Check reports why d cannot run with cfg: a rule its descriptors name is gone or changed
// into one that cannot sit behind a descriptor. A config reload that fails it is refused.
func (d *Domains) Check(cfg *config.Config) error {
	var errs []error
	for name, where := range d.rules {
		if err := ruleUsable(cfg, name); err != nil {
			errs = append(errs, fmt.Errorf("%s: rule: %w", where, err))
		}
	}
	return errors.Join(errs...)
}

// unknownField is how yaml.v3 words an unknown key.
var unknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)

// decodeErrors words a decoding error of file: one error per problem, each naming the file and
// line, an unknown key as such.
func decodeErrors(file string, err error) []error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []error{fmt.Errorf("%s: %s", file, strings.ReplaceAll(err.Error(), "\n", " "))}
	}
	var errs []error
	for _, e := range te.Errors {
		if m := unknownField.FindStringSubmatch(e); m != nil {
			errs = append(errs, fmt.Errorf("%s:%s: unknown field %q", file, m[1], m[2]))
		} else {
			errs = append(errs, fmt.Errorf("%s: %s", file, e))
		}
	}
	return errs
}
