// A small JVM HTTP server (com.sun.net.httpserver): GET /inc adds one to a
// counter and answers "<count> <currentTimeMillis>"; GET /quit ends it.
// usage: java CounterServer.java PORT
import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicLong;

public class CounterServer {
    public static void main(String[] args) throws Exception {
        AtomicLong count = new AtomicLong();
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(args[0])), 64);
        server.createContext("/inc", ex -> {
            byte[] body = (count.incrementAndGet() + " " + System.currentTimeMillis() + "\n")
                    .getBytes(StandardCharsets.US_ASCII);
            ex.sendResponseHeaders(200, body.length);
            try (OutputStream os = ex.getResponseBody()) { os.write(body); }
        });
        server.createContext("/quit", ex -> {
            byte[] body = "bye\n".getBytes(StandardCharsets.US_ASCII);
            ex.sendResponseHeaders(200, body.length);
            try (OutputStream os = ex.getResponseBody()) { os.write(body); }
            System.exit(0);
        });
        server.start();
    }
}
