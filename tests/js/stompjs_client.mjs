// A real @stomp/stompjs client over WebSocket (Node with the ws package),
// driven by tests/integration/test_websocket.py.
//
//   node stompjs_client.mjs URL TOPIC QUEUE
//
// Subscribes to /topic/TOPIC (auto ack) and /queue/QUEUE (client ack),
// prints {"ready": true} once both are receipted, then publishes
// "from-node" to the topic and "job-from-node" to /queue/QUEUE.out, and
// prints each message it receives as one JSON line. Exits after it got
// "stop" on the topic.
import { Client } from "@stomp/stompjs";
import WebSocket from "ws";

const [url, topic, queue] = process.argv.slice(2);
const print = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const client = new Client({
  webSocketFactory: () => new WebSocket(url, ["v12.stomp", "v11.stomp", "v10.stomp"]),
  connectHeaders: JSON.parse(process.env.STOMP_CONNECT_HEADERS || "{}"),
  heartbeatIncoming: 1000,
  heartbeatOutgoing: 1000,
  reconnectDelay: 0,
  onStompError: (frame) => { print({ error: frame.headers.message }); process.exit(2); },
  onWebSocketError: (event) => { print({ error: String(event.message || event) }); process.exit(3); },
});

function subscribed(destination, callback, headers) {
  return new Promise((resolve) => {
    const receipt = `sub-${destination}`;
    client.watchForReceipt(receipt, () => resolve());
    client.subscribe(destination, callback, { ...headers, receipt });
  });
}

client.onConnect = async (frame) => {
  print({ connected: frame.headers.version, subprotocol: client.webSocket.protocol });
  await subscribed(`/topic/${topic}`, (message) => {
    print({ destination: message.headers.destination, body: message.body });
    if (message.body === "stop") {
      client.deactivate().then(() => process.exit(0));
    }
  }, {});
  await subscribed(`/queue/${queue}`, (message) => {
    print({ destination: message.headers.destination, body: message.body,
            redelivered: message.headers.redelivered });
    message.ack();
  }, { ack: "client-individual" });
  print({ ready: true });
  client.publish({ destination: `/topic/${topic}`, body: "from-node" });
  client.publish({ destination: `/queue/${queue}.out`, body: "job-from-node",
                   headers: { "x-from": "node" } });
};

client.activate();
setTimeout(() => { print({ error: "timed out" }); process.exit(4); }, 60000);
