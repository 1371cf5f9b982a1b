package mapping

import (
	"regexp"
	"sync"

	"github.com/kmm-project/kmm/internal/kernel"
)

// maxCachedPatterns bounds the compiled-pattern cache: patterns come from Modules, so an
// administrator editing mappings over months cannot make it grow without end.
const maxCachedPatterns = 256

// compiled is a pattern's compilation: the expression, or why it is refused.
type compiled struct {
	re  *regexp.Regexp
	err error
}

// patterns memoizes compiled regular expressions: a Module's kernel mapping is matched against
// every node's kernel, and compiling it each time was the largest part of the Module→NMC decision.
var patterns = struct {
	sync.Mutex
	compiled map[string]compiled
}{compiled: map[string]compiled{}}

// CompilePattern is kernel.CompilePattern (bounded size and cost) with a cache: the kernel
// mappings' regexps, and fsm's drain for a Module's ignoredNamespacePatterns. Compiled expressions
// are safe for concurrent use. Refused patterns are cached too: one that got past admission would
// otherwise be parsed again for every node (270 µs each for \pL{1000}\pN{1000}).
func CompilePattern(pattern string) (*regexp.Regexp, error) {
	patterns.Lock()
	c, ok := patterns.compiled[pattern]
	patterns.Unlock()
	if ok {
		return c.re, c.err
	}
	re, err := kernel.CompilePattern(pattern)
	patterns.Lock()
	defer patterns.Unlock()
	if len(patterns.compiled) >= maxCachedPatterns {
		clear(patterns.compiled)
	}
	patterns.compiled[pattern] = compiled{re: re, err: err}
	return re, err
}
