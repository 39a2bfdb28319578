package tiktokencount

// asciiSplitter returns where the piece of s that starts at i ends, s
// being ASCII only: the end of what the encoding's pattern matches at i.
// Every character starts a match of both patterns, so the pieces cover s.
//
// The regular expression engine costs most of a short count (about 15 of
// 18 µs for a 145-byte chat request); these do the same in a few hundred
// nanoseconds. On ASCII, the pattern's classes are: \p{L} the letters
// (\p{Lu} A-Z, \p{Ll} a-z; \p{Lt}, \p{Lm}, \p{Lo} and \p{M} hold no ASCII),
// \p{N} the digits, \s the space and \t \n \v \f \r. TestASCIISplit checks
// both splitters against the patterns.
type asciiSplitter func(s string, i int) int

// splitCL100K follows cl100kPattern's alternatives in order:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)   a contraction
//	[^\r\n\p{L}\p{N}]?\p{L}+       letters, after one other character
//	\p{N}{1,3}                     up to 3 digits
//	 ?[^\s\p{L}\p{N}]+[\r\n]*      punctuation, after a space, with the line breaks after it
//	\s*[\r\n]+ | \s+(?!\S) | \s+   white space (see splitSpace)
func splitCL100K(s string, i int) int {
	c := s[i]
	if n := contraction(s, i); n > 0 {
		return i + n
	}
	if j := afterPrefix(s, i, isLetter); isLetter(s[j]) {
		return runOf(s, j, isLetter)
	}
	if isDigit(c) {
		return digits(s, i)
	}
	if end, ok := punctuation(s, i, isCRLF); ok {
		return end
	}
	return splitSpace(s, i)
}

// splitO200K follows o200kPattern's alternatives in order, the letter
// classes on ASCII:
//
//	[^\r\n\p{L}\p{N}]?[A-Z]*[a-z]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?   a word, capitalised or not
//	[^\r\n\p{L}\p{N}]?[A-Z]+[a-z]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?   a word in capitals
//	\p{N}{1,3}                                                   up to 3 digits
//	 ?[^\s\p{L}\p{N}]+[\r\n/]*                                   punctuation, with line breaks and slashes after it
//	\s*[\r\n]+ | \s+(?!\S) | \s+                                 white space (see splitSpace)
func splitO200K(s string, i int) int {
	c := s[i]
	if j := afterPrefix(s, i, isLetter); isLetter(s[j]) {
		// Upper case then lower case letters, or upper case letters
		// alone; the classes do not overlap, so neither alternative can
		// backtrack into another split.
		end := runOf(s, runOf(s, j, isUpper), isLower)
		return end + contraction(s, end)
	}
	if isDigit(c) {
		return digits(s, i)
	}
	if end, ok := punctuation(s, i, isCRLFOrSlash); ok {
		return end
	}
	return splitSpace(s, i)
}

// afterPrefix returns i+1 when s[i] can be the optional
// [^\r\n\p{L}\p{N}] before a run of letters and a letter follows it,
// otherwise i: where the letters would start.
func afterPrefix(s string, i int, letter func(byte) bool) int {
	c := s[i]
	if i+1 < len(s) && letter(s[i+1]) && !isLetter(c) && !isDigit(c) && c != '\r' && c != '\n' {
		return i + 1
	}
	return i
}

// punctuation matches " ?[^\s\p{L}\p{N}]+" at i followed by the run of
// characters trail accepts, and reports whether it matched.
func punctuation(s string, i int, trail func(byte) bool) (int, bool) {
	j := i
	if s[j] == ' ' && j+1 < len(s) && isOther(s[j+1]) {
		j++
	}
	if !isOther(s[j]) {
		return 0, false
	}
	return runOf(s, runOf(s, j, isOther), trail), true
}

// splitSpace matches the white space alternatives at i, where s[i] is
// white space and no earlier alternative matched:
//
//	\s*[\r\n]+   up to the last line break of the run
//	\s+(?!\S)    else the run but its last character, which then joins
//	             the word after it (the whole run at the end of s)
//	\s+          else the single character
func splitSpace(s string, i int) int {
	end := runOf(s, i, isSpace)
	for k := end - 1; k >= i; k-- {
		if isCRLF(s[k]) {
			return k + 1
		}
	}
	if end == len(s) || end-1 == i {
		return end
	}
	return end - 1
}

// contraction returns the length of the (?i:'s|'t|'re|'ve|'m|'ll|'d) at
// i, or 0.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	second := byte(0) // the letter a three-character contraction ends in
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		second = 'e'
	case 'l':
		second = 'l'
	default:
		return 0
	}
	if i+2 < len(s) && lower(s[i+2]) == second {
		return 3
	}
	return 0
}

// digits matches \p{N}{1,3} at i.
func digits(s string, i int) int {
	end := i + 1
	for end < len(s) && end < i+3 && isDigit(s[end]) {
		end++
	}
	return end
}

// runOf returns the end of the run of characters in s from i that in
// accepts.
func runOf(s string, i int, in func(byte) bool) int {
	for i < len(s) && in(s[i]) {
		i++
	}
	return i
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isUpper(c byte) bool  { return 'A' <= c && c <= 'Z' }
func isLower(c byte) bool  { return 'a' <= c && c <= 'z' }
func isLetter(c byte) bool { return isUpper(c) || isLower(c) }
func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isSpace(c byte) bool  { return c == ' ' || '\t' <= c && c <= '\r' }
func isCRLF(c byte) bool   { return c == '\r' || c == '\n' }
func isOther(c byte) bool  { return !isLetter(c) && !isDigit(c) && !isSpace(c) }

func isCRLFOrSlash(c byte) bool { return isCRLF(c) || c == '/' }
