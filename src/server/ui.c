/* GET /: the chat page (src/server/chat.html), compiled into the binary by
 * CMakeLists.txt as the byte array chat_html. */
#include "server/server.h"
#include "chat_html.h"

void srv_ui(srv_server *srv, const srv_request *rq) {
    (void)srv;
    srv_reply_text(rq, 200, "text/html; charset=utf-8", (const char *)chat_html, sizeof chat_html);
}
