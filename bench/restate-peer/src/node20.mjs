// The Restate SDK (1.17) calls Promise.withResolvers, which Node has from 22 on; this machine
// runs Node 20. Imported first by peer.mjs, before the SDK is evaluated.
if (typeof Promise.withResolvers !== "function") {
    Promise.withResolvers = function withResolvers() {
        let resolve;
        let reject;
        const promise = new this((res, rej) => {
            resolve = res;
            reject = rej;
        });
        return { promise, resolve, reject };
    };
}
