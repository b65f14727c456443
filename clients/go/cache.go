package fusebox

import (
	"sync"
	"time"
)

// openCache remembers keys the server reported OPEN until a deadline, so
// that guards answer Blocked locally until then. It is bounded: when full,
// expired entries go first, then the one that ends soonest. Once an entry
// ends the next request goes to the server, which admits one probe for the
// whole fleet.
type openCache struct {
	mu    sync.Mutex
	limit int
	until map[string]time.Time
}

func newOpenCache(limit int) *openCache {
	return &openCache{limit: limit, until: make(map[string]time.Time)}
}

// blockedFor returns how long key is still known OPEN at now (0: not).
func (c *openCache) blockedFor(key string, now time.Time) time.Duration {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.until[key]
	if !ok {
		return 0
	}
	if !now.Before(until) {
		delete(c.until, key)
		return 0
	}
	return until.Sub(now)
}

func (c *openCache) put(key string, until time.Time, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.until[key]; !ok && len(c.until) >= c.limit {
		var victim string
		var soonest time.Time
		for k, u := range c.until {
			if !now.Before(u) {
				delete(c.until, k)
				continue
			}
			if victim == "" || u.Before(soonest) {
				victim, soonest = k, u
			}
		}
		if len(c.until) >= c.limit && victim != "" {
			delete(c.until, victim)
		}
	}
	c.until[key] = until
}

func (c *openCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.until, key)
	c.mu.Unlock()
}

func (c *openCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.until)
}

// Forget drops the local short-circuit entry for key: the next guard asks
// the server again.
func (c *Client) Forget(key string) { c.cache.forget(key) }
