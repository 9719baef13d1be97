// HTML escaping as markupsafe (and so jinja2's `escape` filter) does it: & < > " ' become
// &amp; &lt; &gt; &#34; &#39;. Used by the chat-template filter and bench-serve's HTML report.
#pragma once

#include <string>

namespace kestrel {

std::string HtmlEscape(const std::string& s);

}  // namespace kestrel
